"""The C kernels of reductions, softmax and normalization agree with the reference interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import cuvil
from tests.support.c_reduce_kernels import F16, F32, I32, I64, compare, make_model, rand


def test_reductions_symbolic_shapes(cache: Path) -> None:
    rng = np.random.default_rng(0)
    ops = [("ReduceSum", [1], 1), ("ReduceMean", [-1], 0), ("ReduceMax", None, 1), ("ReduceMin", [0, 2], 0),
           ("ReduceProd", [2], 1), ("ReduceL1", [0], 0), ("ReduceL2", [1, 2], 1), ("ReduceLogSumExp", [1], 0),
           ("ReduceSumSquare", [-2], 1), ("ReduceLogSum", [2], 1)]
    nodes, consts, outs = [helper.make_node("Abs", ["x"], ["ax"])], {}, []
    for i, (op, axes, keep) in enumerate(ops):
        ins = ["x" if op != "ReduceLogSum" else "ax"]
        if axes is not None:
            consts[f"axes{i}"] = np.array(axes, np.int64)
            ins.append(f"axes{i}")
        nodes.append(helper.make_node(op, ins, [f"y{i}"], keepdims=keep))
        outs.append(f"y{i}")
    nodes += [helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
              helper.make_node("ArgMin", ["x"], ["an"], axis=-1, select_last_index=1),
              helper.make_node("CumSum", ["x", "cax"], ["cs"], exclusive=1, reverse=1),
              helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=1, largest=1),
              helper.make_node("TopK", ["x", "k"], ["sv", "si"], axis=0, largest=0)]
    consts.update(cax=np.array(1, np.int64), k=np.array([2], np.int64))
    outs += ["am", "an", "cs", "tv", "ti", "sv", "si"]
    model = make_model(nodes, [("x", F32, ["N", 3, 4])], outs, consts)
    x5 = rand(rng, (5, 3, 4))
    x5[0, :, 0] = 1.0  # ties for arg_max / top_k
    compare(model, [{"x": rand(rng, (2, 3, 4))}, {"x": x5}], cache, targets=("generic", "native"))


def test_runtime_axes_and_errors(cache: Path) -> None:
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["k"], keepdims=1),
             helper.make_node("ReduceMax", ["x", "axes2"], ["d"], keepdims=0)]
    model = make_model(nodes, [("x", F32, [2, 3, 4]), ("axes", I64, ["A"]), ("axes2", I32, [2])], ["k", "d"])
    x = rand(np.random.default_rng(1), (2, 3, 4))
    feeds = [{"x": x, "axes": np.array([0, -1], np.int64), "axes2": np.array([2, 0], np.int32)},
             {"x": x, "axes": np.array([], np.int64), "axes2": np.array([1, -1], np.int32)}]
    compare(model, feeds, cache)
    m = cuvil.compile(model, target="generic", cache_dir=str(cache))
    with pytest.raises(Exception, match="axis 3 is out of range for rank 3"):
        m.run({"x": x, "axes": np.array([3], np.int64), "axes2": np.array([0, 1], np.int32)})
    with pytest.raises(Exception, match="axis -3 is listed twice"):
        m.run({"x": x, "axes": np.array([0], np.int64), "axes2": np.array([0, -3], np.int32)})


def test_integer_bool_and_empty_reductions(cache: Path) -> None:
    nodes = [helper.make_node("ReduceSum", ["i", "a1"], ["s"], keepdims=0),
             helper.make_node("ReduceProd", ["i", "a1"], ["p"]),
             helper.make_node("ReduceMean", ["i", "a1"], ["m"]),
             helper.make_node("ReduceMax", ["i"], ["mx"], keepdims=0),
             helper.make_node("ReduceSum", ["b8", "a1"], ["s8"]),
             helper.make_node("ReduceL1", ["b8", "a1"], ["l8"]),
             helper.make_node("ReduceMax", ["bo", "a1"], ["bmax"]),
             helper.make_node("ReduceMin", ["bo", "a1"], ["bmin"]),
             helper.make_node("ReduceSum", ["e", "a0"], ["es"]),
             helper.make_node("ReduceMax", ["e", "a0"], ["em"]),
             helper.make_node("ReduceMean", ["e", "a0"], ["emean"]),
             helper.make_node("ReduceLogSumExp", ["e", "a0"], ["else"]),
             helper.make_node("CumSum", ["i", "a1s"], ["ci"])]
    consts = {"a1": np.array([1], np.int64), "a0": np.array([0], np.int64), "a1s": np.array(1, np.int32)}
    model = make_model(nodes, [("i", I32, [3, 5]), ("b8", TensorProto.INT8, [2, 40]), ("bo", TensorProto.BOOL, [2, 3]),
                               ("e", F32, [0, 3])],
                       ["s", "p", "m", "mx", "s8", "l8", "bmax", "bmin", "es", "em", "emean", "else", "ci"], consts)
    rng = np.random.default_rng(2)
    feed: dict[str, np.ndarray] = {"i": rng.integers(-50, 50, (3, 5)).astype(np.int32), "b8": rng.integers(-128, 127, (2, 40)).astype(np.int8),
            "bo": np.array([[0, 1, 0], [0, 0, 0]], bool), "e": np.zeros((0, 3), np.float32)}
    compare(model, [feed], cache)


def test_half_precision(cache: Path) -> None:
    nodes = [helper.make_node("ReduceSum", ["x", "ax"], ["s"]),
             helper.make_node("ReduceLogSumExp", ["x", "ax"], ["l"]),
             helper.make_node("Softmax", ["x"], ["sm"], axis=1),
             helper.make_node("LogSoftmax", ["x"], ["lsm"], axis=-1),
             helper.make_node("LayerNormalization", ["x", "sc", "b"], ["ln"], axis=-1),
             helper.make_node("TopK", ["x", "k"], ["tv", "ti"])]
    consts = {"ax": np.array([1], np.int64), "sc": np.full([6], 1.5, np.float16), "b": np.full([6], 0.25, np.float16),
              "k": np.array([3], np.int64)}
    model = make_model(nodes, [("x", F16, ["N", 4, 6])], ["s", "l", "sm", "lsm", "ln", "tv", "ti"], consts)
    rng = np.random.default_rng(3)
    compare(model, [{"x": rand(rng, (2, 4, 6), np.float16)}, {"x": rand(rng, (1, 4, 6), np.float16)}], cache)


def test_softmax_family_and_top_k_runtime(cache: Path) -> None:
    nodes = [helper.make_node("Softmax", ["x"], ["s0"], axis=0),
             helper.make_node("LogSoftmax", ["x"], ["l1"], axis=1),
             helper.make_node("Hardmax", ["x"], ["h1"], axis=1),
             helper.make_node("Hardmax", ["x"], ["h2"], axis=-1),
             helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=1, largest=0)]
    model = make_model(nodes, [("x", F32, [3, "N", 4]), ("k", I64, [1])], ["s0", "l1", "h1", "h2", "tv", "ti"])
    rng = np.random.default_rng(4)
    compare(model, [{"x": rand(rng, (3, 5, 4)), "k": np.array([2], np.int64)},
                    {"x": np.ones((3, 2, 4), np.float32), "k": np.array([0], np.int64)}], cache)
    m = cuvil.compile(model, target="generic", cache_dir=str(cache))
    with pytest.raises(Exception, match=r"K=7 is outside \[0, 5\]"):
        m.run({"x": rand(rng, (3, 5, 4)), "k": np.array([7], np.int64)})


def test_softmax_coerce_2d(cache: Path) -> None:
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=1), helper.make_node("Hardmax", ["x"], ["h"], axis=1)]
    model = make_model(nodes, [("x", F32, [2, 3, 4])], ["s", "h"], opset=11)
    compare(model, [{"x": rand(np.random.default_rng(5), (2, 3, 4))}], cache)


def test_normalizations(cache: Path) -> None:
    rng = np.random.default_rng(6)
    consts = {"c": rand(rng, [3]), "cb": rand(rng, [3]), "cm": rand(rng, [3]),
              "cv": np.abs(rand(rng, [3])) + 0.5, "sc": rand(rng, [1, 5]), "b": rand(rng, [5]), "sc3": rand(rng, [4, 5])}
    nodes = [helper.make_node("BatchNormalization", ["x", "c", "cb", "cm", "cv"], ["bn"], epsilon=1e-3),
             helper.make_node("InstanceNormalization", ["x", "c", "cb"], ["inn"]),
             helper.make_node("LayerNormalization", ["x", "sc", "b"], ["ln", "mean", "inv"], axis=-1),
             helper.make_node("LayerNormalization", ["x", "sc3"], ["ln2"], axis=2),
             helper.make_node("GroupNormalization", ["x", "c", "cb"], ["gn"], num_groups=3),
             helper.make_node("LpNormalization", ["x"], ["lp1"], axis=0, p=1),
             helper.make_node("LpNormalization", ["x"], ["lp2"], axis=-1, p=2)]
    model = make_model(nodes, [("x", F32, ["N", 3, 4, 5])], ["bn", "inn", "ln", "mean", "inv", "ln2", "gn", "lp1", "lp2"],
                       consts)
    x = rand(rng, (2, 3, 4, 5))
    x[0, 0, 0] = 0.0  # a zero Lp norm gives 0
    compare(model, [{"x": x}, {"x": rand(rng, (1, 3, 4, 5))}], cache, targets=("generic", "native"))
