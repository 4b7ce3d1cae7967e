"""What a native call takes and gives back: read-only, strided and empty inputs, small outputs
(copied into arrays NumPy owns) and large ones (shared with the model's buffer), all writable and
independent of the next call."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.backends.c import library
from cuvil.errors import InputError


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


def test_static_model_checks_every_call_after_the_first(tmp_path: object) -> None:
    """A static model's repeated calls take a short path (no conversions, the input descriptors
    reused); an input of another shape, type or kind between them still gets the full checks."""
    m = cuvil.compile(_scale_model([3, 4]), target="native", cache_dir=str(tmp_path))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    for _ in range(2):
        np.testing.assert_array_equal(m(x)[0], x * x)
    with pytest.raises(InputError, match="dim 1"):
        m(np.zeros((3, 5), np.float32))
    with pytest.raises(InputError, match="float"):
        m(x.astype(np.float64))
    with pytest.raises(InputError):
        m(x, x)
    np.testing.assert_array_equal(m(memoryview(x))[0], x * x)  # array-likes are converted
    wide = np.repeat(x, 2, axis=1)[:, ::2]  # the same values, not contiguous
    np.testing.assert_array_equal(m(wide)[0], x * x)
    np.testing.assert_array_equal(m(x + 1)[0], (x + 1) * (x + 1))
