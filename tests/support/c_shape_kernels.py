"""Models of shape and indexing kernels for the C tests (value infos, a model from nodes, int64 constants,
seeded random tensors), the generic C build compared with the reference interpreter, the expected run-time error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import numpy.typing as npt
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import cuvil
from cuvil.errors import CuvilError

OPSET = 20


RNG = np.random.default_rng(11)


def vi(name: str, elem: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def make_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: Sequence[str],
               inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """A model whose outputs are typed by the importer (left untyped here)."""
    g = helper.make_graph(nodes, "g", inputs, [onnx.ValueInfoProto(name=o) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def compile_c(model: onnx.ModelProto, tmp: Path) -> cuvil.CompiledModel:
    m = cuvil.compile(model, target="generic", cache_dir=str(tmp / "cache"))
    assert m.build_info.warnings == ""  # type: ignore[union-attr]
    return m


def compare(model: onnx.ModelProto, feeds: Sequence[Sequence[np.ndarray]], tmp: Path) -> cuvil.CompiledModel:
    """The C build and the reference agree exactly (dtype, shape, values) on every feed."""
    c = compile_c(model, tmp)
    ref = cuvil.compile(model, target="ref")
    for xs in feeds:
        got, want = c(*xs), ref(*xs)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
            if w.dtype.kind == "f" or w.dtype == ml_dtypes.bfloat16:
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6, atol=0,
                                           err_msg=f"output {i}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
    return c


def fails(model: cuvil.CompiledModel, xs: Sequence[np.ndarray], message: str) -> None:
    with pytest.raises(CuvilError, match=message):
        model(*xs)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def const(name: str, value: Sequence[int]) -> onnx.TensorProto:
    return helper.make_tensor(name, T.INT64, [len(value)], list(value))


def randn(*shape: int, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
    return np.asarray(RNG.standard_normal(shape), dtype=dtype)
