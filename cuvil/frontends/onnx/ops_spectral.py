"""Importers of ONNX DFT and STFT (Cuvil's ``dft`` and ``stft``).

DFT-17 and DFT-19 take the axis as an attribute (default 1); DFT-20 as an optional input
(default -2).  Both become the ``axis`` input of Cuvil's ``dft``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.graph import Value


def _flags(ctx: ImportCtx, names: Sequence[str], defaults: Sequence[int]) -> dict[str, int]:
    out = {}
    for name, default in zip(names, defaults):
        v = int(ctx.attr(name, default))
        if v not in (0, 1):
            raise ctx.fail(f"{name} must be 0 or 1, got {v}")
        out[name] = v
    return out


@importer("DFT", since=17)
def _dft(ctx: ImportCtx) -> Sequence[Value | None]:
    x, length = ctx.input(0), ctx.input(1)
    if x is None:
        raise ctx.fail("input 0 (the signal) is required")
    if ctx.opset < 20:
        known_attrs(ctx, ("axis", "inverse", "onesided"))
        axis: Value | None = ctx.constant(np.int64(int(ctx.attr("axis", 1))))
    else:
        known_attrs(ctx, ("inverse", "onesided"))
        axis = ctx.input(2)
        if axis is None:
            axis = ctx.constant(np.int64(-2))
    return ctx.emit("dft", [x, length, axis], _flags(ctx, ("inverse", "onesided"), (0, 0)))


@importer("STFT", since=17)
def _stft(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("onesided",))
    if ctx.input(0) is None or ctx.input(1) is None:
        raise ctx.fail("inputs signal and frame_step are required")
    return ctx.emit("stft", ctx.inputs(), _flags(ctx, ("onesided",), (1,)))
