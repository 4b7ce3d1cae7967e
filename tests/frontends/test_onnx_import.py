"""The ONNX front end: initializers, Constant nodes, external data, symbols, names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.symbolic import DimExpr

HOSTILE = ['q"uote', "back\\slash", "new\nline", "two words", "int", "return", "*/ #include <x.h> /*", "naïve_Ωμέγα_名前"]


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] = (), opset: int = 17) -> onnx.ModelProto:  # type: ignore[assignment]
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def test_hostile_names_import_print_parse_and_run() -> None:
    x, w, y, z = HOSTILE[0], HOSTILE[1], HOSTILE[2], HOSTILE[3]
    nodes = [
        helper.make_node("Add", [x, w], [y], name=HOSTILE[4]),
        helper.make_node("Relu", [y], [z], name=HOSTILE[5]),
        helper.make_node("Mul", [z, x], [HOSTILE[6]], name=HOSTILE[7]),
    ]
    wv = np.array([1.0, -2.0, 3.0], np.float32)
    m = _model(
        nodes,
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info(HOSTILE[6], TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(wv, w)],
    )
    g = load_onnx(m)
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text
    assert [n.name for n in parse_graph(text).nodes if n.op != "constant"] == [*HOSTILE[4:6], HOSTILE[7]]
    a = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    for graph in (g, parse_graph(text)):
        (out,) = cuvil.compile(graph)(a)
        np.testing.assert_allclose(out, np.maximum(a + wv, 0) * a, rtol=1e-6)
    assert cuvil.compile(m).output_names == [HOSTILE[6]]


def test_dim_params_become_symbols() -> None:
    m = _model(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["batch", 4])],
    )
    cm = cuvil.compile(m)
    d = cm.input_specs[0].shape[0]
    assert isinstance(d, DimExpr) and str(d) == "batch"
    assert "batch" in cm.symbols
    for n in (1, 5):
        a = np.ones((n, 4), np.float32)
        assert cm(a, a)[0].shape == (n, 4)


def test_constant_nodes_and_initializers() -> None:
    m = _model(
        [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
            helper.make_node("Mul", ["x", "k"], ["y"]),
            helper.make_node("Add", ["y", "bias"], ["z"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "bias")],
    )
    (z,) = cuvil.compile(m)(np.array([1.0, 1.0, 1.0], np.float32))
    np.testing.assert_array_equal(z, [3.0, 4.0, 5.0])


def test_initializer_listed_as_input_keeps_its_value() -> None:
    bias = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "bias")
    m = _model(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]), helper.make_tensor_value_info("bias", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [bias],
    )
    m.ir_version = 3
    cm = cuvil.compile(m)
    assert cm.input_names == ["x"]
    np.testing.assert_array_equal(cm(np.zeros(2, np.float32))[0], [1.0, 2.0])


def _external_model(tmp_path: Path) -> tuple[Path, np.ndarray]:
    w = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    m = _model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        [numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    return path, w


def test_external_data_next_to_the_model(tmp_path: Path) -> None:
    path, w = _external_model(tmp_path)
    assert (tmp_path / "weights.bin").stat().st_size == w.nbytes
    x = np.ones((64, 64), np.float32)
    (y,) = cuvil.compile(path)(x)
    np.testing.assert_array_equal(y, x + w)
    expected = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, expected)


def test_external_data_missing_or_escaping_is_refused(tmp_path: Path) -> None:
    path, _ = _external_model(tmp_path)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(cuvil.ModelError, match=r"external data file .weights\.bin. not found"):
        cuvil.compile(path)
    m = onnx.load(str(path), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
    evil = tmp_path / "evil.onnx"
    onnx.save(m, str(evil))
    with pytest.raises(cuvil.ModelError, match="outside the model's folder"):
        cuvil.compile(evil)


def test_unsupported_element_type_is_named() -> None:
    m = _model(
        [helper.make_node("Identity", ["s"], ["t"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [2])],
    )
    with pytest.raises(cuvil.UnsupportedOpError, match="STRING"):
        cuvil.compile(m)
