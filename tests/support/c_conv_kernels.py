"""Single-kernel ONNX models for the C convolution, pooling and resize tests, and their comparison with the
reference interpreter (value infos, a model from nodes, seeded random tensors and weights, the expected run-time
error)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from tests.support.c_models import OPSET, compare, fails, make_model, vi

__all__ = ["OPSET", "RNG", "compare", "fails", "make_model", "randn", "vi", "weight"]

RNG = np.random.default_rng(3)


def randn(*shape: int, dtype: type[np.generic] = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def weight(name: str, *shape: int, dtype: type[np.generic] = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(randn(*shape, dtype=dtype), name)
