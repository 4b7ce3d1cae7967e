"""fuse-attention, recognize-layernorm, the ``attention`` op and its C kernel.

The passes are checked on exported-style graphs with the manager's instruments (the
reference interpreter before and after each pass, on seeded inputs); the kernel against the
op's NumPy reference (itself checked against ONNX's on the conformance cases), at sizes that
exercise partial query and key blocks, and across thread counts, bitwise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import cuvil
from cuvil.frontends.onnx import load_onnx
from cuvil.metrics import relative_l2
from cuvil.passes import NumericEach, PassManager, VerifyEach, default_pipeline
from tests.support.paths import NODE_TESTS


def _vi(name: str, shape: list[int], dt: int = T.FLOAT) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, dt, shape)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto],
           out: onnx.ValueInfoProto, opset: int = 18) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "m", inputs, [out], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def _layernorm_model(square: str, recip: bool, affine: bool) -> onnx.ModelProto:
    """LayerNorm over the last two axes as torch.onnx writes it before opset 17."""
    n = [h.make_node("ReduceMean", ["x"], ["m"], axes=[-2, -1]), h.make_node("Sub", ["x", "m"], ["d"])]
    n.append(h.make_node("Pow", ["d", "two"], ["sq"]) if square == "pow" else h.make_node("Mul", ["d", "d"], ["sq"]))
    n += [h.make_node("ReduceMean", ["sq"], ["var"], axes=[-2, -1]), h.make_node("Add", ["var", "eps"], ["ve"]),
          h.make_node("Sqrt", ["ve"], ["sd"])]
    if recip:
        n += [h.make_node("Reciprocal", ["sd"], ["inv"]), h.make_node("Mul", ["d", "inv"], ["nrm"])]
    else:
        n.append(h.make_node("Div", ["d", "sd"], ["nrm"]))
    last = "nrm"
    if affine:
        n += [h.make_node("Mul", ["gamma", "nrm"], ["g"]), h.make_node("Add", ["g", "beta"], ["y"])]
        last = "y"
    n.append(h.make_node("Identity", [last], ["out"]))
    rng = np.random.default_rng(1)
    inits = [h.make_tensor("two", T.FLOAT, [], [2.0]), h.make_tensor("eps", T.FLOAT, [], [1e-5]),
             onnx.numpy_helper.from_array(rng.standard_normal((3, 16)).astype(np.float32), "gamma"),
             onnx.numpy_helper.from_array(rng.standard_normal((16,)).astype(np.float32), "beta")]
    return _model(n, [_vi("x", [2, 5, 3, 16])], inits, _vi("out", [2, 5, 3, 16]), opset=13)


def _run(pipeline: str, graph: Any) -> tuple[Any, PassManager]:
    pm = PassManager(pipeline, instruments=[VerifyEach(), NumericEach(seed=0)])
    return pm.run(graph), pm


@pytest.mark.parametrize("square,recip,affine", [("pow", False, True), ("mul", True, True), ("pow", False, False)])
def test_recognize_layernorm(square: str, recip: bool, affine: bool) -> None:
    graph, pm = _run("recognize-layernorm,dce", load_onnx(_layernorm_model(square, recip, affine)))
    ops = [n.op for n in graph.nodes if n.op != "constant"]
    assert ops == ["layer_norm", "identity"] or ops == ["layer_norm"], ops
    ln = next(n for n in graph.nodes if n.op == "layer_norm")
    assert ln.attrs["axis"] == -2 and ln.attrs["epsilon"] == pytest.approx(1e-5, rel=1e-7)
    assert pm.report is not None
    record = pm.report.records[0]
    assert record.changed and record.verified and not record.notes
    assert record.errors is not None and max(record.errors.values()) <= 1e-6, record.errors


def test_recognize_layernorm_leaves_other_axes_alone() -> None:
    model = _layernorm_model("pow", False, True)
    for node in model.graph.node:
        if node.op_type == "ReduceMean" and node.output[0] == "var":
            node.attribute[0].ints[:] = [-1]  # the variance over fewer axes than the mean: not LayerNorm
    graph, pm = _run("recognize-layernorm", load_onnx(model))
    assert not any(n.op == "layer_norm" for n in graph.nodes)
    assert pm.report is not None and not pm.report.records[0].changed


def _attention_subgraph(b: int, heads: int, s: int, d: int, mask_shape: list[int] | None) -> onnx.ModelProto:
    """BERT's attention core: (Q Kᵀ) * c (+ mask) -> softmax -> · V, K split as [b, s, h, d]."""
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]), h.make_node("MatMul", ["q", "kt"], ["s"]),
             h.make_node("Mul", ["s", "c"], ["s2"])]
    inputs = [_vi("q", [b, heads, s, d]), _vi("k", [b, s, heads, d]), _vi("v", [b, heads, s, d])]
    last = "s2"
    if mask_shape is not None:
        nodes.append(h.make_node("Add", ["mask", "s2"], ["s3"]))
        inputs.append(_vi("mask", mask_shape))
        last = "s3"
    nodes += [h.make_node("Softmax", [last], ["p"], axis=-1), h.make_node("MatMul", ["p", "v"], ["y"])]
    return _model(nodes, inputs, [h.make_tensor("c", T.FLOAT, [], [1 / np.sqrt(d)])], _vi("y", [b, heads, s, d]))


def _feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in model.graph.input:
        shape = [x.dim_value for x in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == T.BOOL:
            feeds[i.name] = rng.random(shape) < 0.7
        elif i.name == "mask":
            feeds[i.name] = np.where(rng.random(shape) < 0.8, 0.0, -10000.0).astype(np.float32)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def test_fused_attention_kernel_matches_unfused(tmp_path: Path) -> None:
    # 70 queries and keys: partial query blocks and a partial key block; 2 batches, a [b, 1, 1, s] mask
    model = _attention_subgraph(2, 3, 70, 24, [2, 1, 1, 70])
    feeds = _feeds(model)
    ref = cuvil.compile(model, target="ref").run(feeds)["y"]
    fused = cuvil.compile(model, target="native", cache_dir=str(tmp_path), num_threads=1)
    assert any(n.op == "attention" for n in fused.graph.nodes)
    assert relative_l2(fused.run(feeds)["y"], ref) <= 1e-5
    unfused = cuvil.compile(model, target="native", cache_dir=str(tmp_path), enable_fusion=False, num_threads=1)
    assert not any(n.op == "attention" for n in unfused.graph.nodes)
    # across thread counts the results are bitwise the same
    two = cuvil.compile(model, target="native", cache_dir=str(tmp_path), num_threads=2)
    np.testing.assert_array_equal(two.run(feeds)["y"], fused.run(feeds)["y"])


def test_onnx_attention_long_causal_gqa(tmp_path: Path) -> None:
    # 3-D inputs, grouped-query heads, a causal and a bool mask, softcap, 150 keys: key blocks
    # skipped by the causal frontier, and the qk output (scores after the bias) requested.
    node = h.make_node("Attention", ["q", "k", "v", "mask"], ["y", "", "", "qk"], is_causal=1, q_num_heads=4,
                       kv_num_heads=2, softcap=5.0, qk_matmul_output_mode=2)
    model = _model([node], [_vi("q", [2, 150, 4 * 16]), _vi("k", [2, 150, 2 * 16]), _vi("v", [2, 150, 2 * 8]),
                            _vi("mask", [150, 150], T.BOOL)], [], _vi("y", [2, 150, 4 * 8]), opset=23)
    model.graph.output.append(_vi("qk", [2, 4, 150, 150]))
    feeds = _feeds(model, seed=3)
    ref = cuvil.compile(model, target="ref").run(feeds)
    got = cuvil.compile(model, target="native", cache_dir=str(tmp_path), num_threads=1).run(feeds)
    assert relative_l2(got["y"], ref["y"]) <= 1e-5
    finite = np.isfinite(ref["qk"])
    np.testing.assert_array_equal(np.isfinite(got["qk"]), finite)
    assert relative_l2(got["qk"][finite], ref["qk"][finite]) <= 1e-5


def test_default_pipeline_has_the_passes() -> None:
    text = default_pipeline("native")
    assert "recognize-layernorm,fuse-attention,fuse-epilogue" in text
    off = default_pipeline("native", enable_fusion=False)
    assert "fuse-attention" not in off and "recognize-layernorm" not in off


def test_attention_op_refuses_bad_input() -> None:
    node = h.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=3, kv_num_heads=2)
    model = _model([node], [_vi("q", [1, 4, 24]), _vi("k", [1, 4, 16]), _vi("v", [1, 4, 16])], [],
                   _vi("y", [1, 4, 24]), opset=23)
    with pytest.raises(cuvil.CuvilError, match="not a multiple"):
        load_onnx(model)
    window = h.make_node("Attention", ["q", "k", "v"], ["y"], left_window_size=2)
    model = _model([window], [_vi(n, [1, 2, 4, 8]) for n in "qkv"], [], _vi("y", [1, 2, 4, 8]), opset=23)
    with pytest.raises(cuvil.UnsupportedOpError, match="left_window_size"):
        load_onnx(model)


@pytest.mark.skipif(not NODE_TESTS.is_dir(), reason="conformance data not found beside the repo")
@pytest.mark.parametrize("case", ["test_attention_3d_gqa_with_past_and_present", "test_attention_4d_attn_mask_3d_causal",
                                  "test_attention_4d_causal_nonpad_batch_prefill", "test_attention_4d_with_qk_matmul_softcap"])
def test_attention_reference_agrees_with_inference(case: str) -> None:
    # as tests/ops/test_registry.py does for the core ops: static and symbolic shapes
    from cuvil.backends.ref.interpreter import run_graph
    from cuvil.conformance import case_dirs, load_case
    from cuvil.ir.symbolic import evaluate, is_unknown
    from tests.support.node_cases import randomized_inputs, symbolic_dims

    (folder,) = [c for c in case_dirs(str(NODE_TESTS)) if Path(c).name == case]
    model, inputs, _ = load_case(folder)
    assert isinstance(model, onnx.ModelProto)
    data = randomized_inputs(inputs, seed=len(case))
    with np.errstate(all="ignore"):
        static_out = run_graph(load_onnx(model), data, check_types=True)
    sym_model, env = symbolic_dims(model)
    sg = load_onnx(sym_model)
    assert env
    with np.errstate(all="ignore"):
        sym_out = run_graph(sg, data, check_types=True)
    for v, a, b in zip(sg.outputs, sym_out, static_out):
        np.testing.assert_array_equal(a, b)
        for d, n in zip(v.type.shape, a.shape):
            assert is_unknown(d) or evaluate(d, env) == n
