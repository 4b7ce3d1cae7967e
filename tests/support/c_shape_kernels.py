"""Models of shape and indexing kernels for the C tests (value infos, a model from nodes, int64 constants,
seeded random tensors), the generic C build compared with the reference interpreter, the expected run-time error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto as T
from onnx import helper

import cuvil
from tests.support import c_models
from tests.support.c_models import OPSET, fails, make_model, vi

__all__ = ["OPSET", "RNG", "compare", "const", "fails", "i64", "make_model", "randn", "vi"]

RNG = np.random.default_rng(11)


def compare(model: onnx.ModelProto, feeds: Sequence[Sequence[np.ndarray]], tmp: Path) -> cuvil.CompiledModel:
    """The generic C build and the reference agree: integers exactly, floating values within 1e-6."""
    return c_models.compare(model, feeds, tmp, rtol=1e-6, atol=0)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def const(name: str, value: Sequence[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, T.INT64, [len(value)], list(value))


def randn(*shape: int, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)
