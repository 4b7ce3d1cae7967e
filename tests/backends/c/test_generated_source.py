"""Generated C: hostile names stay inert, output is deterministic and warning-free."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.backends.c.codegen import CodegenOptions, generate
from cuvil.backends.c.writer import c_comment
from cuvil.frontends.onnx import load_onnx

HOSTILE = [
    'q"uote', "back\\slash\\", "new\nline", "*/ int evil; /*", "#include <stdlib.h>", "int", "??=trigraph",
    "naïve_Ωμέγα_名前", "%s%n%x", "a b\tc\r", "\\x41\\0",
]


_C_TOKENS = re.compile(r'/\*.*?\*/|"(?:[^"\\\n]|\\.)*"', re.S)


def hostile_model() -> onnx.ModelProto:
    """Add, Mul and Neg over values and nodes named with every hostile string."""
    x = HOSTILE[0]
    nodes = []
    prev = x
    for i, name in enumerate(HOSTILE[1:]):
        op = ("Add", "Mul", "Neg")[i % 3]
        ins = [prev] if op == "Neg" else [prev, "w"]
        nodes.append(helper.make_node(op, ins, [name], name=HOSTILE[-1 - i]))
        prev = name
    g = helper.make_graph(
        nodes,
        "*/ graph \"name\" \n#define",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ['sym "bol"\n', 3])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ['sym "bol"\n', 3])],
        [numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "w")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_hostile_names_compile_and_run(tmp_path: Path) -> None:
    model = hostile_model()
    m = cuvil.compile(model, target="generic", cache_dir=str(tmp_path))
    ref = cuvil.compile(model, target="ref")
    for n in (1, 4):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_array_equal(m(x)[0], ref(x)[0])
    build = m.build_info
    assert build is not None
    src = build.source.read_text()
    assert build.warnings == ""
    code = _C_TOKENS.sub(lambda m: " " if m.group(0).startswith("/*") else '""', src)
    assert "evil" in src and "evil" not in code  # model text only inside comments and string literals
    for line in src.splitlines():
        assert not line.lstrip().startswith("#") or line.lstrip().startswith(("#include \"cuvil", "#define CUVIL"))
    with pytest.raises(cuvil.InputError, match="dim 1 must be 3"):
        m(np.zeros((2, 4), np.float32))


def test_generated_source_is_deterministic() -> None:
    model = hostile_model()
    a = generate(load_onnx(model), CodegenOptions(target="generic"))
    b = generate(load_onnx(model), CodegenOptions(target="generic"))
    assert a.source == b.source and a.weights == b.weights


def test_each_kernel_is_labelled_with_its_node() -> None:
    g = load_onnx(hostile_model())
    src = generate(g, CodegenOptions()).source
    for n in g.nodes:
        if n.op != "constant":
            assert f"/* {c_comment(f'node {chr(39)}{n.name}{chr(39)}')}" in src
    assert src.count("/* node '") == sum(1 for n in g.nodes if n.op != "constant")
