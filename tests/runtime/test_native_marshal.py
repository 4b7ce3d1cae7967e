"""What a native call takes and gives back: read-only, strided and empty inputs, small outputs
(copied into arrays NumPy owns) and large ones (shared with the model's buffer), all writable and
independent of the next call."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import cuvil
from cuvil.backends.c import library


def _scale_model(shape: list[int | str]) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "x"], ["y"])], "sq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_inputs_of_any_kind_and_outputs_small_and_large(tmp_path: object) -> None:
    m = cuvil.compile(_scale_model(["n", 64]), target="native", cache_dir=str(tmp_path))
    rng = np.random.default_rng(0)
    small = rng.standard_normal((2, 64)).astype(np.float32)
    large_rows = library.COPY_OUTPUT_BYTES // (64 * 4) + 3
    large = rng.standard_normal((large_rows, 64)).astype(np.float32)
    readonly = small.copy()
    readonly.setflags(write=False)
    strided = np.ascontiguousarray(np.concatenate([small, small], axis=1))[:, ::2]
    for x in (small, large, readonly, strided, np.zeros((0, 64), np.float32)):
        y = m(x)[0]
        np.testing.assert_array_equal(y, x * x)
        assert y.flags.writeable and y.shape == x.shape
    # a copied output and a shared one each outlive the next call, unchanged
    y_small, y_large = m(small)[0], m(large)[0]
    m(small * 2)
    m(large * 2)
    np.testing.assert_array_equal(y_small, small * small)
    np.testing.assert_array_equal(y_large, large * large)
