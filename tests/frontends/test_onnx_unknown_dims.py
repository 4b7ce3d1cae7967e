"""Dims that exporters write as unknown (-1, 0, empty, expressions), and declared output shapes that
disagree with inference: cuvil/frontends/onnx/dims.py.  Oracle: onnxruntime, atol 1e-5."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.errors import InputError
from cuvil.frontends.onnx import load_onnx
from cuvil.frontends.onnx.dims import expression
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.symbolic import parse_dim, sym
from tests.support.targets import runnable, slow_builds

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
vi = helper.make_tensor_value_info
ATOL = 1e-5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("unknown-dims-cache"))


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None, value_info: list[onnx.ValueInfoProto] | None = None,
           opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits or [], value_info=value_info or [])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _for_ort(m: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with each declared 0 dim (in every graph) made unknown: onnxruntime reads a 0 as
    a true zero and refuses other sizes there, where Cuvil reads it as unknown (rule 2 of dims.py)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)

    def visit(g: onnx.GraphProto) -> None:
        for v in (*g.input, *g.output, *g.value_info):
            for axis, d in enumerate(v.type.tensor_type.shape.dim):
                if d.WhichOneof("value") == "dim_value" and d.dim_value == 0:
                    d.dim_param = f"ort_{v.name}_{axis}"
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g)

    visit(out.graph)
    return out


def _check(cm: cuvil.CompiledModel, sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    got = cm.run(feeds)
    want = sess.run(None, feeds)
    assert list(got) == [o.name for o in sess.get_outputs()]
    for name, w in zip(got, want):
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, atol=ATOL, err_msg=name)


# every form at once -------------------------------------------------------------------------------

def _no_value(name: str, rest: list[int]) -> onnx.ValueInfoProto:
    """A tensor whose first dim sets neither dim_value nor dim_param."""
    v = vi(name, F32, [1, *rest])
    v.type.tensor_type.shape.dim[0].Clear()
    return v


def _forms_model() -> onnx.ModelProto:
    """One input per form of unknown dim, intermediates and region declarations with -1 and 0 dims."""
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["then_out"])], "then", [], [vi("then_out", F32, [-1, 3])])
    else_g = helper.make_graph([helper.make_node("Relu", ["a"], ["else_out"])], "else", [], [vi("else_out", F32, [0, 3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["acc_in", "c"], ["acc_out"])],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("acc_in", F32, [-1, -1])],
        [vi("c_out", BOOL, []), vi("acc_out", F32, [-1, 3])])
    nodes = [
        helper.make_node("Add", ["a", "c"], ["ac"]),
        helper.make_node("Relu", ["ac"], ["o_ac"]),
        helper.make_node("Relu", ["b"], ["o_b"]),
        helper.make_node("Mul", ["d", "p"], ["o_dp"]),
        helper.make_node("Neg", ["e"], ["o_e"]),
        helper.make_node("Exp", ["f"], ["o_f"]),
        _const("two", np.array(2.0, np.float32)),
        helper.make_node("Mul", ["g", "two"], ["o_g"]),
        helper.make_node("Neg", ["h"], ["o_h"]),
        helper.make_node("If", ["cond"], ["o_if"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trips", "", "c"], ["o_loop"], body=body),
    ]
    inputs = [vi("a", F32, [-1, 3]), vi("b", F32, [0, 3]), vi("c", F32, ["", 3]), _no_value("d", [3]),
              vi("e", F32, ["batch*2", "seq+1"]), vi("f", F32, ["batch", "seq"]), vi("g", F32, ["2*N"]),
              vi("h", F32, ["a*b"]), vi("p", F32, ["p2o.DynamicDimension.0", 3]), vi("cond", BOOL, []),
              vi("trips", I64, [])]
    outputs = [vi("o_ac", F32, [-1, 3]), vi("o_b", F32, [0, 3]), vi("o_dp", F32, ["", 3]),
               vi("o_e", F32, ["batch*2", "seq+1"]), vi("o_f", F32, ["batch", "seq"]), vi("o_g", F32, ["2*N"]),
               vi("o_h", F32, ["a*b"]), vi("o_if", F32, [-1, 3]), vi("o_loop", F32, [-1, 3])]
    value_info = [vi("ac", F32, [-1, -1]), vi("two", F32, [])]
    return _model(nodes, inputs, outputs, value_info=value_info)


def _forms_feeds(rng: np.random.Generator, n: int, cond: bool) -> dict[str, np.ndarray]:
    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return {"a": r(n, 3), "b": r(2, 3), "c": r(n, 3), "d": r(5, 3), "e": r(2 * n, n + 1), "f": r(n, n),
            "g": r(2 * n + 2), "h": r(6), "p": r(5, 3), "cond": np.array(cond), "trips": np.array(n, np.int64)}


def test_each_form_reads_as_a_symbol_or_expression() -> None:
    g = load_onnx(_forms_model())
    shapes = {v.name: v.type.shape for v in g.inputs}
    assert shapes["a"] == (sym("a_dim0"), 3)  # -1
    assert shapes["b"] == (sym("b_dim0"), 3)  # 0 on an input
    assert shapes["c"] == (sym("c_dim0"), 3)  # empty dim_param
    assert shapes["d"] == (sym("d_dim0"), 3)  # no value at all
    assert shapes["e"] == (2 * sym("batch"), sym("seq") + 1)  # expressions over names another input uses
    assert shapes["g"] == (2 * sym("N"),)  # an expression that binds its own name (N = dim / 2)
    assert shapes["h"] == (sym("a*b"),)  # nothing binds a or b: the text names one symbol
    assert shapes["p"] == (sym("p2o.DynamicDimension.0"), 3)  # not an expression: a plain name
    assert {"a", "b", "N", "batch", "seq"} & set(g.symbols) == {"N", "batch", "seq"}
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text


def test_expressions_parse_safely() -> None:
    assert expression("batch*2") == parse_dim("2*batch")
    assert expression("seq+1") == parse_dim("seq + 1")
    assert expression("2*N") == parse_dim("2*N")
    assert expression("(a+1)*2") == parse_dim("2*a + 2")
    assert expression("2*3") == 6
    for plain in ("N", "unk__12", "p2o.DynamicDimension.0", "a b", "batch/2", "floordiv(a)", "?", '"x"*2',
                  "__import__('os').system('x')", "a*" * 150 + "a", "(" * 9 + "a" + ")" * 9, "99999999999*n", ""):
        assert expression(plain) is None, plain


def test_fresh_symbols_avoid_the_models_dim_params() -> None:
    m = _model([helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Neg", ["z"], ["w"])],
               [vi("x", F32, [-1]), vi("z", F32, ["x_dim0"])], [vi("y", F32, [-1]), vi("w", F32, ["x_dim0"])])
    g = load_onnx(m)
    assert [v.type.shape for v in g.inputs] == [(sym("x_dim0_1"),), (sym("x_dim0"),)]
    cm = cuvil.compile(m)
    y, w = cm(np.ones(3, np.float32), np.ones(5, np.float32))  # two independent sizes
    assert y.shape == (3,) and w.shape == (5,)


@pytest.mark.parametrize("target", runnable("ref", "native"))
def test_forms_run_and_match_onnxruntime(target: str, cache: str) -> None:
    m = _forms_model()
    cm = cuvil.compile(m, target=target, cache_dir=cache)
    sess = ort.InferenceSession(_for_ort(m).SerializeToString())
    rng = np.random.default_rng(0)
    for n, cond in ((3, True), (1, False), (4, False)):
        _check(cm, sess, _forms_feeds(rng, n, cond))
    feeds = _forms_feeds(rng, 2, True)
    feeds["b"] = np.zeros((0, 3), np.float32)  # a 0 input dim still takes an empty array
    _check(cm, sess, feeds)
    bad = _forms_feeds(rng, 2, True)
    bad["e"] = bad["e"][:3]  # 3 rows is not 2*batch
    with pytest.raises(InputError, match="multiple of 2"):
        cm.run(bad)
    bad = _forms_feeds(rng, 2, True)
    bad["f"] = bad["f"][:1]  # batch = 2 from e, 1 here
    with pytest.raises(InputError, match="batch"):
        cm.run(bad)


# declared output shapes --------------------------------------------------------------------------

def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("cuvil")]


def test_a_contradicted_output_shape_is_replaced_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    m = _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"]),
                helper.make_node("Exp", ["x"], ["k"])],
               [vi("x", F32, ["n", 3])], [vi("y", F32, [5, 3]), vi("z", F32, ["n"]), vi("k", F32, ["n", 3])])
    with caplog.at_level(logging.WARNING, logger="cuvil"):
        cm = cuvil.compile(m)
    msgs = _warnings(caplog)
    assert len(msgs) == 2, msgs
    assert "'y'" in msgs[0] and "[5, 3]" in msgs[0] and "f32[n, 3]" in msgs[0]
    assert "'z'" in msgs[1] and "[n]" in msgs[1] and "f32[n, 3]" in msgs[1]
    assert [s.type for s in cm.output_specs] == [cm.input_specs[0].type] * 3  # the inferred types
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    y, z, k = cm(x)
    np.testing.assert_allclose(y, np.maximum(x, 0), atol=ATOL)
    np.testing.assert_allclose(z, -x, atol=ATOL)
    np.testing.assert_allclose(k, np.exp(x), rtol=1e-6)


def test_declarations_that_say_nothing_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    outs = [vi(f"y{k}", F32, dims) for k, dims in enumerate(([-1, 3], [0, 3], ["", 3], ["unk__7", 3], ["n", 3],
                                                              ["n", -1]))]
    nodes = [helper.make_node("Relu", ["x"], [o.name]) for o in outs]
    with caplog.at_level(logging.WARNING, logger="cuvil"):
        load_onnx(_model(nodes, [vi("x", F32, ["n", 3])], outs))
    assert _warnings(caplog) == []


# a paddle-style graph ------------------------------------------------------------------------------

def _paddle_model() -> onnx.ModelProto:
    """As paddle2onnx writes them: -1 batch dims, weights and shapes as Constant nodes, HardSigmoid/Mul
    and Clip hardswish, a [0, -1] reshape, -1 in the value_info of intermediates."""
    rng = np.random.default_rng(5)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    nodes = [
        _const("conv_w", w(8, 3, 3, 3)), _const("conv_b", w(8)),
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSigmoid", ["c1"], ["hs"], alpha=1.0 / 6, beta=0.5),
        helper.make_node("Mul", ["c1", "hs"], ["hswish"]),
        _const("three", np.array(3.0, np.float32)), _const("lo", np.array(0.0, np.float32)),
        _const("hi", np.array(6.0, np.float32)), _const("sixth", np.array(1.0 / 6, np.float32)),
        helper.make_node("Add", ["hswish", "three"], ["p3"]),
        helper.make_node("Clip", ["p3", "lo", "hi"], ["clipped"]),
        helper.make_node("Mul", ["clipped", "sixth"], ["gate"]),
        helper.make_node("Mul", ["hswish", "gate"], ["hswish2"]),
        _const("pool_shape", np.array([0, -1], np.int64)),
        helper.make_node("Reshape", ["hswish2", "pool_shape"], ["flat"]),
        _const("fc_w", w(8 * 6 * 6, 10)), _const("fc_b", w(10)),
        helper.make_node("MatMul", ["flat", "fc_w"], ["fc"]),
        helper.make_node("Add", ["fc", "fc_b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=-1),
        helper.make_node("Shape", ["x"], ["xs"]),
        _const("s0", np.array([0], np.int64)), _const("s1", np.array([1], np.int64)),
        helper.make_node("Slice", ["xs", "s0", "s1"], ["batch"]),
        _const("tail", np.array([-1], np.int64)),
        helper.make_node("Concat", ["batch", "tail"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["x", "flat_shape"], ["x_flat"]),
        _const("rm_axes", np.array([1], np.int64)),
        helper.make_node("ReduceMean", ["x_flat", "rm_axes"], ["x_mean"], keepdims=1),
    ]
    value_info = [vi("c1", F32, [-1, 8, 6, 6]), vi("hswish", F32, [-1, 8, -1, -1]), vi("flat", F32, [-1, -1]),
                  vi("xs", I64, [4]), vi("batch", I64, [-1])]
    return _model(nodes, [vi("x", F32, [-1, 3, 6, 6])], [vi("prob", F32, [-1, 10]), vi("x_mean", F32, [-1, 1])],
                  value_info=value_info, opset=18)


@pytest.mark.parametrize("target", slow_builds("ref", "native", "wasm32"))
def test_paddle_style_graph_matches_onnxruntime(target: str, cache: str, wasm_cache: str) -> None:
    m = _paddle_model()
    onnx.checker.check_model(m)
    cm = cuvil.compile(m, target=target, cache_dir=wasm_cache if target == "wasm32" else cache)
    assert str(cm.input_specs[0].type) == "f32[x_dim0, 3, 6, 6]"
    sess = ort.InferenceSession(m.SerializeToString())
    rng = np.random.default_rng(2)
    for n in (1, 3):
        _check(cm, sess, {"x": rng.standard_normal((n, 3, 6, 6)).astype(np.float32)})


# hostile dim_param text ---------------------------------------------------------------------------

HOSTILE_DIMS = ["n); exit(1); (", "*/ #include <stdlib.h> /*", 'q"uote', "new\nline", "%s%n%s", "back\\slash",
                "__import__('os').system('x')", "a*b/*", "naïve_名前"]


def _strip_c_strings_and_comments(src: str) -> str:
    src = re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', src)
    return re.sub(r"/\*.*?\*/", "", src, flags=re.S)


@pytest.mark.parametrize("target", runnable("ref", "native"))
def test_hostile_dim_params_are_only_names(target: str, cache: str) -> None:
    inputs = [vi(f"x{k}", F32, [text, 2]) for k, text in enumerate(HOSTILE_DIMS)]
    nodes = [helper.make_node("Relu", [f"x{k}"], [f"y{k}"]) for k in range(len(HOSTILE_DIMS))]
    outputs = [vi(f"y{k}", F32, [text, 2]) for k, text in enumerate(HOSTILE_DIMS)]
    m = _model(nodes, inputs, outputs)
    g = load_onnx(m)
    assert [v.type.shape[0] for v in g.inputs] == [sym(t) for t in HOSTILE_DIMS]
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text
    cm = cuvil.compile(m, target=target, cache_dir=cache)
    rng = np.random.default_rng(4)
    feeds = [rng.standard_normal((k + 1, 2)).astype(np.float32) for k in range(len(HOSTILE_DIMS))]
    for x, y in zip(feeds, cm(*feeds)):
        np.testing.assert_allclose(y, np.maximum(x, 0), atol=ATOL)
    if cm.build_info is not None:
        code = _strip_c_strings_and_comments(Path(cm.build_info.source).read_text(encoding="utf-8"))
        for t in HOSTILE_DIMS:
            assert t not in code
        assert "exit(" not in code and "system(" not in code
