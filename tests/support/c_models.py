"""Small ONNX models built from nodes for the C kernel tests (value infos, a model whose outputs the importer
types), the C build compared with the reference interpreter, and the expected run-time error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import cuvil
from cuvil.errors import CuvilError

OPSET = 20


def vi(name: str, elem: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def make_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: Sequence[str],
               inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """A model whose outputs are typed by the importer (left untyped here)."""
    g = helper.make_graph(nodes, "g", inputs, [onnx.ValueInfoProto(name=o) for o in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])


def compare(model: onnx.ModelProto, feeds: Sequence[Sequence[np.ndarray]], tmp: Path, target: str = "generic",
            rtol: float = 1e-5, atol: float = 1e-5) -> cuvil.CompiledModel:
    """The C build compiles without warnings and agrees with the reference on every feed: same dtype and shape,
    integer and bool values exactly, floating values (bfloat16 included) within ``rtol``/``atol``."""
    c = cuvil.compile(model, target=target, cache_dir=str(tmp / "cache"))
    assert c.build_info.warnings == ""  # type: ignore[union-attr]
    ref = cuvil.compile(model, target="ref")
    for xs in feeds:
        got, want = c(*xs), ref(*xs)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (i, g.dtype, g.shape, w.dtype, w.shape)
            if w.dtype.kind in "iub":
                np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
            else:
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol,
                                           err_msg=f"output {i}")
    return c


def fails(model: cuvil.CompiledModel, xs: Sequence[np.ndarray], message: str) -> None:
    with pytest.raises(CuvilError, match=message):
        model(*xs)
