"""Torch tensors as inputs: what the caller sees is what the model reads.

A torch tensor can carry a lazy negation (``z.conj().imag``, ``_neg_view``) or a
lazy conjugation as a bit beside its data; DLPack shares the data without it, so
the runtime resolves both bits before sharing.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.runtime.torch_io import tensor_to_numpy

torch = pytest.importorskip("torch")


def _add_one() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_a_negative_view_is_read_negated() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64)
    x = z.conj().imag  # the public way to a tensor with the negative bit set
    assert x.is_neg()
    np.testing.assert_array_equal(tensor_to_numpy(x), [-2.0, 4.0, -0.5])
    neg = torch.tensor([1.0, -2.0])._neg_view()
    np.testing.assert_array_equal(tensor_to_numpy(neg), [-1.0, 2.0])


def test_a_conjugated_view_is_read_conjugated() -> None:
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    assert z.is_conj()
    np.testing.assert_array_equal(tensor_to_numpy(z), np.array([1 - 2j, 3 + 4j], np.complex64))


@pytest.mark.parametrize("target", ["ref", "native"])
def test_a_model_given_a_negative_view_computes_on_the_values_it_shows(target: str) -> None:
    m = cuvil.compile(_add_one(), target=target)
    x = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64).conj().imag
    (y,) = m(x)
    np.testing.assert_array_equal(y.numpy(), x.clone().numpy() + 1)
    np.testing.assert_array_equal(y.numpy(), [-1.0, 5.0, 0.5])
