"""Reduction-style one-node models (attribute or input axes) checked against onnxruntime: what the op
tests of reductions, linear algebra and normalization share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.support.single_node import check_close, one_node, run_cuvil

__all__ = ["RNG", "check_against_ort", "run_cuvil"]

RNG = np.random.default_rng(0)


def check_against_ort(
    op_type: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str] = ("y",),
    opset: int = 18,
    *,
    consts: dict[str, np.ndarray] | None = None,
    rtol: float = 1e-5,
    **attrs: object,
) -> list[np.ndarray]:
    """The one-node model of ``op_type`` agrees with onnxruntime within ``rtol``."""
    return check_close(one_node(op_type, inputs, outputs, opset, consts=consts, **attrs), inputs, rtol=rtol)
