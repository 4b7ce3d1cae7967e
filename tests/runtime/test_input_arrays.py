"""Python objects as inputs: what cannot be an array is an InputError naming the input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import InputError


def _relu() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize("value", [[[1.0, 2.0], [3.0]], [[1.0, 2.0], [3.0, [4.0]]]], ids=["ragged", "nested_ragged"])
def test_a_ragged_list_is_an_input_error(target: str, value: object) -> None:
    m = cuvil.compile(_relu(), target=target)
    with pytest.raises(InputError, match="input 'x' cannot be read as an array"):
        m(value)
    with pytest.raises(InputError, match="input 'x' cannot be read as an array"):
        m.run({"x": value})
    (y,) = m(np.array([[1.0, -2.0], [-3.0, 4.0]], np.float32))
    assert y.tolist() == [[1.0, 0.0], [0.0, 4.0]]
