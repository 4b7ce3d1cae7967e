"""convert-layout: which convolutions go channels-last, where the layout changes go, and that the
rewrite changes no value (the reference interpreter before and after, bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil.ops  # noqa: F401  (registers the op set)
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.passes import NumericEach, PassError, PassManager, VerifyEach, default_pipeline, parse_pipeline

RNG = np.random.default_rng(5)


def _dense(shape: tuple[int, ...]) -> str:
    values = ", ".join(repr(float(v)) for v in np.round(RNG.standard_normal(shape), 2).reshape(-1))
    return f"dense<f32[{', '.join(map(str, shape))}]> [{values}]"


def _graph(body: str, inputs: str = "%x: f32[n, 8, 6, 6]") -> Graph:
    return parse_graph(f"graph main({inputs}) {{\n  symbol n\n{body}\n}}\n")


def _run(graph: Graph, pipeline: str = "convert-layout") -> Graph:
    pm = PassManager(pipeline, instruments=[VerifyEach(), NumericEach(seed=0)])
    out = pm.run(graph)
    assert pm.report is not None
    for record in pm.report.records:
        assert record.errors is not None and all(e == 0.0 for e in record.errors.values()), record.errors
    return out


def _ops(graph: Graph) -> list[str]:
    return [n.op for n in graph.nodes if n.op != "constant"]


CHAIN = f"""  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %wd = constant() {{value = {_dense((8, 1, 3, 3))}}} : f32[8, 1, 3, 3]
  %c1 = conv(%x, %w1) : f32[n, 8, 6, 6]
  %r1 = relu(%c1) : f32[n, 8, 6, 6]
  %d = conv(%r1, %wd) {{group = 8, pads = [1, 1, 1, 1]}} : f32[n, 8, 6, 6]
  %y = add(%d, %x) : f32[n, 8, 6, 6]
  return %y"""


def test_a_chain_changes_layout_only_at_its_edges() -> None:
    g = _run(_graph(CHAIN))
    assert _ops(g) == ["transpose", "conv_nhwc", "relu", "conv_nhwc", "add", "transpose"]
    assert [v.name for v in g.outputs] == ["y"] and str(g.outputs[0].type) == "f32[n, 8, 6, 6]"
    # the weights are transposed constants in the kernel's layout, the old ones are gone
    shapes = sorted(str(n.outputs[0].type) for n in g.nodes if n.op == "constant")
    assert shapes == ["f32[1, 1, 8, 8]", "f32[3, 3, 1, 8]"]


def test_auto_keeps_winograd_convolutions_in_nchw_and_all_converts_them() -> None:
    body = f"""  %w = constant() {{value = {_dense((8, 8, 3, 3))}}} : f32[8, 8, 3, 3]
  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %c = conv(%x, %w) {{pads = [1, 1, 1, 1]}} : f32[n, 8, 6, 6]
  %y = conv(%c, %w1) : f32[n, 8, 6, 6]
  return %y"""
    assert _ops(_run(_graph(body))) == ["conv", "conv"]  # 3x3 multiply-adds dominate: nothing converts
    assert _ops(_run(_graph(body), "convert-layout{convs=all}")) == ["transpose", "conv_nhwc", "conv_nhwc",
                                                                       "transpose"]


def test_nchw_readers_get_one_transpose_before_their_first_use() -> None:
    body = f"""  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %axes = constant() {{value = dense<i64[2]> [2, 3]}} : i64[2]
  %c = conv(%x, %w1) : f32[n, 8, 6, 6]
  %m = reduce_mean(%c, %axes) : f32[n, 8, 1, 1]
  %s = reduce_max(%c, %axes) : f32[n, 8, 1, 1]
  %r = relu(%c) : f32[n, 8, 6, 6]
  return %m, %s, %r"""
    g = _run(_graph(body))
    assert _ops(g) == ["transpose", "conv_nhwc", "transpose", "reduce_mean", "reduce_max", "relu", "transpose"]


def test_constants_broadcast_and_scalars() -> None:
    body = f"""  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %bias = constant() {{value = {_dense((8, 1, 1))}}} : f32[8, 1, 1]
  %row = constant() {{value = {_dense((6,))}}} : f32[6]
  %half = constant() {{value = dense<f32[]> [0.5]}} : f32[]
  %c = conv(%x, %w1) : f32[n, 8, 6, 6]
  %a = add(%c, %bias) : f32[n, 8, 6, 6]
  %b = mul(%a, %row) : f32[n, 8, 6, 6]
  %y = mul(%b, %half) : f32[n, 8, 6, 6]
  return %y"""
    g = _run(_graph(body))
    assert _ops(g) == ["transpose", "conv_nhwc", "add", "mul", "mul", "transpose"]
    consts = {n.outputs[0].name: str(n.outputs[0].type) for n in g.nodes if n.op == "constant"}
    assert consts["bias_nhwc"] == "f32[1, 1, 1, 8]" and consts["row_nhwc"] == "f32[1, 1, 6, 1]"
    assert consts["half"] == "f32[]"


def test_regions_read_nchw_values() -> None:
    body = f"""  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %c = conv(%x, %w1) : f32[n, 8, 6, 6]
  %y = if(%p) {{then_branch = graph then() {{
      %t = relu(%c) : f32[n, 8, 6, 6]
      return %t
    }}, else_branch = graph else() {{
      return %c
    }}}} : f32[n, 8, 6, 6]
  return %y"""
    g = _run(_graph(body, "%x: f32[n, 8, 6, 6], %p: bool[]"))
    assert _ops(g) == ["transpose", "conv_nhwc", "transpose", "if"]


def test_options_and_default_pipeline() -> None:
    with pytest.raises(PassError, match="unknown layout 'nchwc'"):
        parse_pipeline("convert-layout{layout=nchwc}")
    with pytest.raises(PassError, match="convs='some' is not one of all, auto"):
        parse_pipeline("convert-layout{convs=some}")
    text = default_pipeline("native")
    assert "convert-layout" in text and text.index("convert-layout") < text.index("fuse-epilogue")
    assert "convert-layout" not in default_pipeline("native", enable_fusion=False)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_reduced_precision_convolutions_convert(dtype: str) -> None:
    """float16 / bfloat16 convolutions go channels-last like float32 ones (their kernels widen the
    operands); a float64 one stays (no channels-last kernel runs it)."""
    low = CHAIN.replace("f32[", f"{dtype}[").replace("dense<f32", f"dense<{dtype}")
    g = _run(_graph(low, f"%x: {dtype}[n, 8, 6, 6]"))
    assert _ops(g) == ["transpose", "conv_nhwc", "relu", "conv_nhwc", "add", "transpose"]
    assert str(g.outputs[0].type) == f"{dtype}[n, 8, 6, 6]"
    wide = CHAIN.replace("f32[", "f64[").replace("dense<f32", "dense<f64")
    assert _ops(_run(_graph(wide, "%x: f64[n, 8, 6, 6]"))) == ["conv", "relu", "conv", "add"]


def test_a_transposed_nhwc_input_is_its_own_twin() -> None:
    # an NHWC model as tf2onnx writes it: its input transposed to NCHW for the convolution
    body = f"""  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %t = transpose(%x) {{perm = [0, 3, 1, 2]}} : f32[n, 8, 6, 6]
  %c = conv(%t, %w1) : f32[n, 8, 6, 6]
  %r = relu(%c) : f32[n, 8, 6, 6]
  %y = transpose(%r) {{perm = [0, 2, 3, 1]}} : f32[n, 6, 6, 8]
  return %y"""
    g = _run(_graph(body, "%x: f32[n, 6, 6, 8]"))
    # both pairs cancel: the input's transpose is dropped with nothing reading it, and the output's
    # transpose back to NHWC is the relu's twin, which takes the output's name
    assert _ops(g) == ["conv_nhwc", "relu"]
    assert g.nodes[[n.op for n in g.nodes].index("conv_nhwc")].inputs[0] is g.inputs[0]
    assert [v.name for v in g.outputs] == ["y"] and str(g.outputs[0].type) == "f32[n, 6, 6, 8]"


def test_a_transpose_back_to_nhwc_read_inside_the_graph_reads_the_twin() -> None:
    body = f"""  %w1 = constant() {{value = {_dense((8, 8, 1, 1))}}} : f32[8, 8, 1, 1]
  %c = conv(%x, %w1) : f32[n, 8, 6, 6]
  %t = transpose(%c) {{perm = [0, 2, 3, 1]}} : f32[n, 6, 6, 8]
  %s = constant() {{value = dense<i64[2]> [0, -1]}} : i64[2]
  %y = reshape(%t, %s) : f32[n, 288]
  return %y, %t"""
    g = _run(_graph(body, "%x: f32[n, 8, 6, 6]"), "convert-layout{convs=all}")
    assert _ops(g) == ["transpose", "conv_nhwc", "reshape"]  # the flatten reads the conv's twin
    assert [v.name for v in g.outputs] == ["y", "t"]
