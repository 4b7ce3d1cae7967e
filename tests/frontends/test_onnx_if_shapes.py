"""If nodes whose condition depends only on shapes (folded at import: cuvil/frontends/onnx/conditions.py),
and data-dependent Ifs whose branches differ in dim sizes (run-time extents).  Oracle: onnxruntime
(and PyTorch eager for the exported modules), atol 1e-5."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.api import import_model
from cuvil.errors import ModelError, UnsupportedOpError
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.graph import Graph
from tests.support.targets import runnable, slow_builds

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
vi = helper.make_tensor_value_info
ATOL = 1e-5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("if-shapes-cache"))


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           opset: int = 17, domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                            *(helper.make_opsetid(d, 1) for d in domains)])
    m.ir_version = 8
    return m


def _const(name: str, value: object) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _branch(name: str, nodes: list[onnx.NodeProto], out: str, dims: list[object]) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [vi(out, F32, dims)])


def _ops(g: Graph) -> list[str]:
    return [n.op for n in g.walk()]


def _matches(cm: cuvil.CompiledModel, sess: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> None:
    got = cm.run(feeds)
    for (name, a), b in zip(got.items(), sess.run(None, feeds)):
        assert a.shape == b.shape, name
        np.testing.assert_allclose(a, b, atol=ATOL, err_msg=name)


# decided at import -----------------------------------------------------------------------------------

def _rank_model() -> onnx.ModelProto:
    """TorchScript-style guards on rank and shape, over an input with a symbolic batch:

    - ``if x.dim() == 3``: Shape -> Size -> Equal(3) -> If, the branches of different ranks;
    - ``if not (x.dim() == 4) and x.size(1) > 3``: Not/And of a rank test and a static dim's test;
    - ``if x.size(0) < 0``: a dim against a negative constant (dims are never negative)."""
    rank_then = _branch("rank_then", [_const("ax0", np.array([0], np.int64)),
                                      helper.make_node("ReduceSum", ["x", "ax0"], ["r_t"], keepdims=0)], "r_t", [4, 5])
    rank_else = _branch("rank_else", [_const("ax1", np.array([0], np.int64)),
                                      helper.make_node("Unsqueeze", ["x", "ax1"], ["r_e"])], "r_e", [1, "b", 4, 5])
    and_then = _branch("and_then", [helper.make_node("Flatten", ["x"], ["a_t"], axis=1)], "a_t", ["b", 20])
    and_else = _branch("and_else", [helper.make_node("Transpose", ["x"], ["a_e"], perm=[2, 1, 0])], "a_e", [5, 4, "b"])
    neg_then = _branch("neg_then", [helper.make_node("Identity", ["x"], ["n_t"])], "n_t", ["b", 4, 5])
    neg_else = _branch("neg_else", [helper.make_node("Abs", ["x"], ["n_e"])], "n_e", ["b", 4, 5])
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Size", ["shape"], ["rank"]),
        _const("three", np.array(3, np.int64)), _const("four", np.array(4, np.int64)),
        helper.make_node("Equal", ["rank", "three"], ["is3"]),
        helper.make_node("If", ["is3"], ["r"], name="rank_if", then_branch=rank_then, else_branch=rank_else),
        helper.make_node("Equal", ["rank", "four"], ["is4"]),
        helper.make_node("Not", ["is4"], ["not4"]),
        _const("one", np.array(1, np.int64)),
        helper.make_node("Gather", ["shape", "one"], ["d1"], axis=0),
        helper.make_node("Greater", ["d1", "three"], ["wide"]),
        helper.make_node("And", ["not4", "wide"], ["both"]),
        helper.make_node("If", ["both"], ["a"], name="and_if", then_branch=and_then, else_branch=and_else),
        _const("zero", np.array(0, np.int64)), _const("minus1", np.array(-1, np.int64)),
        helper.make_node("Gather", ["shape", "zero"], ["d0"], axis=0),
        helper.make_node("Less", ["d0", "minus1"], ["never"]),
        helper.make_node("Cast", ["never"], ["never_b"], to=BOOL),
        helper.make_node("If", ["never_b"], ["n"], name="neg_if", then_branch=neg_then, else_branch=neg_else),
    ]
    return _model(nodes, [vi("x", F32, ["b", 4, 5])], [vi("r", F32, [4, 5]), vi("a", F32, ["b", 20]),
                                                        vi("n", F32, ["b", 4, 5])])


def test_shape_conditions_fold_and_only_the_taken_branch_is_imported() -> None:
    g = load_onnx(_rank_model())
    assert "if" not in _ops(g)
    assert [str(v.type) for v in g.outputs] == ["f32[4, 5]", "f32[b, 20]", "f32[b, 4, 5]"]
    ops = _ops(g)
    assert "reduce_sum" in ops and "flatten" in ops and "abs" in ops
    assert "unsqueeze" not in ops and "transpose" not in ops  # the branches not taken were never converted


@pytest.mark.parametrize("target", runnable("ref", "native"))
def test_folded_shape_ifs_match_onnxruntime(target: str, cache: str) -> None:
    m = _rank_model()
    cm = cuvil.compile(m, target=target, cache_dir=cache)
    sess = ort.InferenceSession(m.SerializeToString())
    rng = np.random.default_rng(0)
    for b in (1, 3):
        _matches(cm, sess, {"x": rng.standard_normal((b, 4, 5)).astype(np.float32)})


def _loop_model() -> onnx.ModelProto:
    """A rank test inside a Loop body: the If folds within the region."""
    then_g = _branch("then", [helper.make_node("Add", ["acc_in", "x"], ["t"])], "t", ["n"])
    else_g = _branch("else", [_const("ax", np.array([0], np.int64)),
                              helper.make_node("Unsqueeze", ["acc_in", "ax"], ["e"])], "e", [1, "n"])
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Shape", ["acc_in"], ["s"]),
         helper.make_node("Size", ["s"], ["r"]), _const("one", np.array(1, np.int64)),
         helper.make_node("Equal", ["r", "one"], ["is1"]),
         helper.make_node("If", ["is1"], ["acc_out"], then_branch=then_g, else_branch=else_g)],
        "body", [vi("i", I64, []), vi("c_in", BOOL, []), vi("acc_in", F32, ["n"])],
        [vi("c_out", BOOL, []), vi("acc_out", F32, ["n"])])
    return _model([helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)],
                  [vi("trips", I64, []), vi("x", F32, ["n"])], [vi("y", F32, ["n"])])


@pytest.mark.parametrize("target", runnable("ref", "native"))
def test_a_shape_if_inside_a_loop_body_folds(target: str, cache: str) -> None:
    m = _loop_model()
    ops = _ops(load_onnx(m))
    assert "loop" in ops and "if" not in ops and "unsqueeze" not in ops
    cm = cuvil.compile(m, target=target, cache_dir=cache)
    sess = ort.InferenceSession(m.SerializeToString())
    rng = np.random.default_rng(8)
    for trips, n in ((3, 4), (0, 2), (5, 1)):
        _matches(cm, sess, {"trips": np.array(trips, np.int64), "x": rng.standard_normal(n).astype(np.float32)})


def _dead_branch_model(cond_value: bool | None) -> onnx.ModelProto:
    """The else branch holds an op Cuvil has no importer for and gives another rank; the condition is a
    constant (``cond_value``) or, for None, a graph input."""
    then_g = _branch("then", [helper.make_node("Neg", ["x"], ["t"])], "t", [3])
    else_g = _branch("else", [helper.make_node("NoSuchOp", ["x"], ["e"], domain="com.example")], "e", [1, 3])
    nodes = [helper.make_node("If", ["c"], ["y"], name="guarded", then_branch=then_g, else_branch=else_g)]
    inputs = [vi("x", F32, [3])]
    if cond_value is None:
        inputs.append(vi("c", BOOL, []))
    else:
        nodes.insert(0, _const("c", np.array(cond_value)))
    return _model(nodes, inputs, [vi("y", F32, [3])], domains=("com.example",))


def test_an_unsupported_op_in_a_branch_not_taken_does_not_matter() -> None:
    x = np.array([1.0, -2.0, 3.0], np.float32)
    (y,) = cuvil.compile(_dead_branch_model(True))(x)
    np.testing.assert_array_equal(y, -x)
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):  # the branch taken holds it
        cuvil.compile(_dead_branch_model(False))
    with pytest.raises(UnsupportedOpError, match="NoSuchOp"):  # run time decides: both branches are needed
        cuvil.compile(_dead_branch_model(None))


def _squeeze_model() -> onnx.ModelProto:
    """``x.squeeze(0)`` as the TorchScript exporter writes it for a dynamic dim 0: If(size(0) == 1)."""
    then_g = _branch("sq_then", [_const("axes", np.array([0], np.int64)),
                                 helper.make_node("Squeeze", ["x", "axes"], ["sq"])], "sq", [4])
    else_g = _branch("sq_else", [helper.make_node("Identity", ["x"], ["id"])], "id", ["b", 4])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), _const("zero", np.array([0], np.int64)),
             helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0), _const("one", np.array([1], np.int64)),
             helper.make_node("Equal", ["d0", "one"], ["eq"]),
             helper.make_node("Cast", ["eq"], ["c"], to=BOOL),
             helper.make_node("If", ["c"], ["picked"], name="squeeze_if", then_branch=then_g, else_branch=else_g),
             _const("two", np.array(2.0, np.float32)), helper.make_node("Mul", ["picked", "two"], ["y"])]
    return _model(nodes, [vi("x", F32, ["b", 4])], [vi("y", F32, ["b", 4])])


def test_a_size_condition_the_constraints_do_not_decide_is_a_clear_error() -> None:
    with pytest.raises(ModelError) as info:
        cuvil.compile(_squeeze_model())
    msg = str(info.value)
    assert "'squeeze_if'" in msg and "f32[4]" in msg and "f32[b, 4]" in msg and "ranks differ" in msg
    assert "depends on b" in msg


@pytest.mark.parametrize("target", slow_builds("ref", "native"))
def test_constraints_decide_a_size_condition(target: str, cache: str) -> None:
    m = _squeeze_model()
    sess = ort.InferenceSession(m.SerializeToString())
    cm = cuvil.compile(m, target=target, cache_dir=cache, dims={"b": (2, 16)})  # never 1: no squeeze
    assert str(cm.output_specs[0].type) == "f32[b, 4]"
    rng = np.random.default_rng(1)
    for b in (2, 5):
        _matches(cm, sess, {"x": rng.standard_normal((b, 4)).astype(np.float32)})
    one = cuvil.compile(m, target=target, cache_dir=cache, dims={"b": 1})  # always 1: squeezed
    assert str(one.output_specs[0].type) == "f32[4]"
    _matches(one, sess, {"x": rng.standard_normal((1, 4)).astype(np.float32)})


# decided at run time ------------------------------------------------------------------------------

def _data_model() -> onnx.ModelProto:
    """If(sum(x) > 0): x[0:2] or concat(x, x): the same rank, other sizes; the result feeds a MatMul and a
    reduction, and is an output itself."""
    then_g = _branch("then", [_const("s0", np.array([0], np.int64)), _const("e0", np.array([2], np.int64)),
                              helper.make_node("Slice", ["x", "s0", "e0"], ["t"])], "t", [2, 3])
    else_g = _branch("else", [helper.make_node("Concat", ["x", "x"], ["e"], axis=0)], "e", ["2*n", 3])
    w = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), _const("zero", np.array(0, np.float32)),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["picked"], name="pick", then_branch=then_g, else_branch=else_g),
             _const("w", w), helper.make_node("MatMul", ["picked", "w"], ["mm"]), helper.make_node("Relu", ["mm"], ["y"]),
             _const("ax", np.array([0], np.int64)), helper.make_node("ReduceSum", ["picked", "ax"], ["m"], keepdims=1)]
    return _model(nodes, [vi("x", F32, ["n", 3])], [vi("y", F32, [-1, 4]), vi("m", F32, [1, 3]),
                                                     vi("picked", F32, [-1, 3])])


@pytest.mark.parametrize("target", slow_builds("ref", "native", "wasm32"))
def test_branches_of_other_sizes_give_run_time_extents(target: str, cache: str, wasm_cache: str) -> None:
    m = _data_model()
    cm = cuvil.compile(m, target=target, cache_dir=wasm_cache if target == "wasm32" else cache)
    assert [str(s.type) for s in cm.output_specs] == ["f32[?, 4]", "f32[1, 3]", "f32[?, 3]"]
    sess = ort.InferenceSession(m.SerializeToString())
    rng = np.random.default_rng(3)
    for n, sign in ((5, 1), (5, -1), (2, 1), (3, -1), (0, 1)):
        _matches(cm, sess, {"x": (np.abs(rng.standard_normal((n, 3))) * sign).astype(np.float32)})


def test_branches_of_other_element_types_are_a_clear_error() -> None:
    then_g = helper.make_graph([helper.make_node("Cast", ["x"], ["t"], to=I64)], "then", [], [vi("t", I64, ["n"])])
    else_g = _branch("else", [helper.make_node("Neg", ["x"], ["e"])], "e", ["n"])
    m = _model([helper.make_node("If", ["c"], ["y"], name="typed_if", then_branch=then_g, else_branch=else_g)],
               [vi("c", BOOL, []), vi("x", F32, ["n"])], [vi("y", F32, ["n"])])
    with pytest.raises(ModelError) as info:
        cuvil.compile(m)
    msg = str(info.value)
    assert "'typed_if'" in msg and "i64[n]" in msg and "f32[n]" in msg and "element types differ" in msg


# what the TorchScript exporter writes ----------------------------------------------------------------

def _export(module: object, example: tuple[object, ...], dynamic_axes: dict[str, dict[int, str]] | None) -> onnx.ModelProto:
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(module), example, f, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes=dynamic_axes, opset_version=17)
    return onnx.load_from_string(f.getvalue())


def _if_count(m: onnx.ModelProto) -> int:
    return sum(n.op_type == "If" for n in m.graph.node)


@pytest.mark.slow
@pytest.mark.parametrize("target", runnable("ref", "native"))
def test_torchscript_guards_on_shapes(target: str, cache: str) -> None:
    import torch

    class SqueezeRank3(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.dim() == 3:
                x = x.squeeze(0)
            return x * 2.0

    class FlattenIfWidth4(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.size(1) == 4:
                return x.flatten(1)
            return x.sum(1)

    rng = np.random.default_rng(5)
    # A static rank: the exporter itself folds `x.dim() == 3`; the If it writes is squeeze(0)'s own
    # guard, size(0) == 1, which only constraints on the dynamic batch decide.
    static = _export(SqueezeRank3(), (torch.randn(1, 4, 5),), None)
    assert _if_count(static) == 0
    dynamic = _export(SqueezeRank3(), (torch.randn(1, 4, 5),), {"x": {0: "b"}})
    assert _if_count(dynamic) == 1
    with pytest.raises(ModelError, match=r"ranks differ.*depends on b"):
        cuvil.compile(dynamic, target=target, cache_dir=cache)
    width = _export(FlattenIfWidth4(), (torch.randn(2, 4, 5),), {"x": {0: "b"}})
    assert _if_count(width) == 1
    cases = [(static, {}, [(1, 4, 5)], SqueezeRank3()), (dynamic, {"b": (2, 8)}, [(2, 4, 5), (3, 4, 5)], SqueezeRank3()),
             (width, {}, [(1, 4, 5), (3, 4, 5)], FlattenIfWidth4())]
    for m, dims, shapes, eager in cases:
        cm = cuvil.compile(m, target=target, cache_dir=cache, dims=dims or None)
        assert "if" not in _ops(import_model(m, dims))  # decided at import (the constrained one by dims)
        sess = ort.InferenceSession(m.SerializeToString())
        for s in shapes:
            x = rng.standard_normal(s).astype(np.float32)
            _matches(cm, sess, {"x": x})
            np.testing.assert_allclose(cm(x)[0], eager(torch.from_numpy(x)).numpy(), atol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("target", runnable("ref", "native"))
def test_torchscript_data_dependent_if(target: str, cache: str) -> None:
    import torch

    class Pick(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return x[:2]
            return torch.cat([x, x])

    m = _export(Pick(), (torch.randn(3, 3),), {"x": {0: "n"}})
    assert _if_count(m) == 1
    cm = cuvil.compile(m, target=target, cache_dir=cache)
    assert str(cm.output_specs[0].type) == "f32[?, 3]"
    sess = ort.InferenceSession(m.SerializeToString())
    rng = np.random.default_rng(6)
    for n, sign in ((3, 1), (3, -1), (5, 1), (1, -1)):
        x = (np.abs(rng.standard_normal((n, 3))) * sign).astype(np.float32)
        _matches(cm, sess, {"x": x})
        np.testing.assert_allclose(cm(x)[0], Pick()(torch.from_numpy(x)).numpy(), atol=ATOL)
