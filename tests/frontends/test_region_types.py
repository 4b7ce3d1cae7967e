"""Values that cross a region boundary: a Loop's carried values against its body's declared inputs.

The importer unifies a carried value's type with what the body declares (refusing a
disagreement), and the generated code checks each carried value's extent against the
body's static dims on every iteration, so a body typed for more elements than it is
given fails the call instead of reading past the buffer.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import CuvilError, ModelError

# What each target says when a carried value does not have the extent the body is typed for.
EXTENT_ERROR = {
    "ref": r"node 'loop0' \(loop\): region 'body' input 'x' is given float32\[1\], its type says f32\[\d+\]",
    "native": r"node loop0 \(loop\): carried value 0 has 1 on axis 0 where \d+ is expected",
}


def _loop(init: list[object], body_in: list[object], *, elem: int = TensorProto.FLOAT,
          body_out: list[object] | None = None, grow: bool = False) -> onnx.ModelProto:
    """``out = Loop(M, x0)`` whose body doubles its carried value ``x`` (declared ``body_in``).

    With ``grow`` the body returns ``concat(2x, 2x[:1])``: one element more than it was given."""
    nodes = [helper.make_node("Identity", ["c"], ["cc"]), helper.make_node("Mul", ["x", "two"], ["y2"])]
    if grow:
        nodes += [helper.make_node("Slice", ["y2", "zero", "one"], ["head"]),
                  helper.make_node("Concat", ["y2", "head"], ["y"], axis=0)]
    else:
        nodes.append(helper.make_node("Identity", ["y2"], ["y"]))
    body = helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", elem, body_in)],
        [helper.make_tensor_value_info("cc", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, body_out if body_out is not None else body_in)],
        [helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0]),
         helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
         helper.make_tensor("one", TensorProto.INT64, [1], [1])],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x0"], ["out"], name="loop0", body=body)], "g",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("x0", TensorProto.FLOAT, init)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _trips(n: int) -> np.ndarray:
    return np.array(n, np.int64)


@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize("k", [3, 1 << 20])
def test_carried_value_smaller_than_the_body_declares_fails_the_call(target: str, k: int) -> None:
    m = cuvil.compile(_loop(["n"], [k]), target=target)
    with pytest.raises(CuvilError, match=EXTENT_ERROR[target]):
        m(_trips(2), np.array([0.16], np.float32))


@pytest.mark.parametrize("target", ["ref", "native"])
def test_carried_value_of_the_declared_size_runs(target: str) -> None:
    m = cuvil.compile(_loop(["n"], [3]), target=target)
    x = np.array([0.16, -1.0, 2.5], np.float32)
    (out,) = m(_trips(2), x)
    np.testing.assert_array_equal(out, x * 4)


@pytest.mark.parametrize("target", ["ref", "native"])
def test_a_carried_value_the_body_grows_is_checked_when_it_comes_back(target: str) -> None:
    # iteration 0 gets [3] as declared and returns [4]; iteration 1 would read [4] as [3]
    m = cuvil.compile(_loop([3], [3], body_out=[4], grow=True), target=target)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    (once,) = m(_trips(1), x)
    np.testing.assert_array_equal(once, [2.0, 4.0, 6.0, 2.0])
    with pytest.raises(CuvilError, match=r"'?loop0'? \(loop\)"):
        m(_trips(2), x)


@pytest.mark.parametrize(("init", "body_in", "elem", "shown"), [
    ([2], [3], TensorProto.FLOAT, "f32[3]"),            # static sizes disagree
    (["n"], [3, 1], TensorProto.FLOAT, "f32[3, 1]"),     # ranks disagree
    ([3], [3], TensorProto.DOUBLE, "f64[3]"),          # element types disagree
])
def test_carried_value_the_body_contradicts_is_refused_at_import(init: list[object], body_in: list[object],
                                                                 elem: int, shown: str) -> None:
    with pytest.raises(ModelError) as info:
        cuvil.compile(_loop(init, body_in, elem=elem), target="ref")
    msg = str(info.value)
    assert "'loop0' (Loop)" in msg and "carried value 0 ('x0')" in msg
    given = "f32[n]" if init == ["n"] else f"f32[{init[0]}]"
    assert f"is {given}" in msg and f"declares its input 'x' as {shown}" in msg


def test_a_symbolic_initial_value_takes_the_size_the_body_declares() -> None:
    m = cuvil.compile(_loop(["n"], [3]), target="ref")
    (loop,) = [n for n in m.graph.nodes if n.op == "loop"]
    assert loop.attrs["body"].inputs[2].type.shape == (3,)


def test_a_region_output_declared_with_another_size_is_refused() -> None:
    with pytest.raises(ModelError, match=r"region 'loop0/body': output 'y' is declared \[4\] but computes f32\[3\]"):
        cuvil.compile(_loop([3], [3], body_out=[4]), target="ref")
