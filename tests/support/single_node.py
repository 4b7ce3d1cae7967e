"""One-node ONNX models run on Cuvil's reference interpreter and on onnxruntime, and shape inference on one
op: what the op tests of shapes, indexing and tensors share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.ir.builder import Builder
from cuvil.ir.types import SymbolInfo, TensorType

RNG = np.random.default_rng(4)


def one_node(
    op_type: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str] = ("y",),
    opset: int = 18,
    *,
    consts: dict[str, np.ndarray] | None = None,
    order: Sequence[str] | None = None,
    **attrs: object,
) -> onnx.ModelProto:
    """A one-node model: ``inputs`` are graph inputs, ``consts`` initializers; ``order`` names the
    node's inputs ("" leaves one out)."""
    consts = consts or {}
    node = helper.make_node(op_type, list(order or [*inputs, *consts]), list(outputs), **attrs)  # type: ignore[arg-type]
    g_in = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
            for n, a in inputs.items()]
    g_out = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs]
    graph = helper.make_graph([node], "g", g_in, g_out, [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def run_cuvil(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(cuvil.compile(model)(*inputs.values()))


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray],
            like: Sequence[np.ndarray | np.dtype]) -> list[np.ndarray]:
    """onnxruntime's outputs; ``like`` gives the output element types it needs declared (arrays or dtypes)."""
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for vi, a in zip(typed.graph.output, like):
        vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(getattr(a, "dtype", a)))
    import onnxruntime as ort  # the importing test modules skip without it

    sess = ort.InferenceSession(typed.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, inputs))


def check_ort(op_type: str, inputs: dict[str, np.ndarray], **kw: object) -> list[np.ndarray]:
    """Cuvil's reference equals onnxruntime exactly (these ops move values, they do not compute)."""
    model = one_node(op_type, inputs, **kw)  # type: ignore[arg-type]
    got = run_cuvil(model, inputs)
    want = run_ort(model, inputs, got)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return got


def check_close(model: onnx.ModelProto, inputs: dict[str, np.ndarray], rtol: float = 1e-5) -> list[np.ndarray]:
    """Cuvil's reference agrees with onnxruntime within ``rtol`` (atol 1e-6, NaN equal to NaN), same dtypes
    and shapes."""
    got = run_cuvil(model, inputs)
    want = run_ort(model, inputs, got)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=1e-6, equal_nan=True)
    return got


def infer(op: str, types: Sequence[TensorType | np.ndarray], symbols: dict[str, SymbolInfo] | None = None,
          n_out: int = 1, **attrs: object) -> list[TensorType]:
    """Output types of ``op``: a TensorType is a run-time input, an array a constant."""
    b = Builder()
    if symbols:
        b.graph.symbols.update(symbols)
    vals = [b.input(f"x{i}", t) if isinstance(t, TensorType) else b.constant(t) for i, t in enumerate(types)]
    return [v.type for v in b.add(op, vals, attrs, num_outputs=n_out)]


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)
