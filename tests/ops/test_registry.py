"""Generated from the op registry: every op's reference agrees with its inference.

For each registered op, the samples are the ONNX conformance cases that
import to that op alone (plus constants).  Each sample runs twice on fresh
random values of the case's shapes (integer and boolean inputs, which are
indices, axes and shapes, keep the case's values):

* with static shapes, the reference must produce exactly the dtype and
  shape that inference gives (the interpreter checks every node);
* with every graph-input dim above 1 made symbolic, inference must still
  succeed, and its symbolic output shapes must evaluate to the shapes the
  reference produced.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict

import numpy as np
import onnx
import pytest

import cuvil.ops
from cuvil.backends.ref.interpreter import run_graph
from cuvil.conformance import case_dirs, in_core_scope, load_case
from cuvil.errors import CuvilError
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.symbolic import evaluate, is_unknown
from tests.support.node_cases import randomized_inputs, symbolic_dims
from tests.support.paths import NODE_TESTS

NODE_DIR = str(NODE_TESTS)
SAMPLES_PER_OP = 4
# Ops that no single-op conformance case exercises on its own; each is covered by the named test.
COVERED_ELSEWHERE = {
    "attention": "tests/passes/test_fuse_attention.py (ONNX Attention is outside the core op list)",
    "constant": "every sample (weights are constants)",
    "conv_nhwc": "tests/passes/test_layout.py (built by convert-layout; reference bit for bit before and after)",
    "conv_integer": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "dequantize_linear": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "dynamic_quantize_linear": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "matmul_integer": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "max_roi_pool": "tests/ops/test_vision_ops.py (ONNX has no MaxRoiPool case: random ROIs against onnxruntime)",
    "full_like": "tests/ops/test_elementwise.py (Dropout's mask, next to an identity)",
    "fused_conv_nhwc": "tests/backends/c/test_conv_nhwc.py (convert-layout then fuse-epilogue; native against ref)",
    "fused_conv": "tests/passes/test_fuse.py (built by fuse-epilogue; fused against unfused, ref and native)",
    "fused_elementwise": "tests/passes/test_fuse.py (built by fuse-elementwise; fused against unfused)",
    "fused_gemm": "tests/passes/test_fuse.py (built by fuse-epilogue; fused against unfused, ref and native)",
    "fused_matmul": "tests/passes/test_fuse.py (built by fuse-epilogue; fused against unfused, ref and native)",
    "reduce_log_sum": "tests/ops/test_reduce.py (ReduceLogSum is outside the core op list)",
    "qlinear_conv": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "qlinear_matmul": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "qlinear_add": "tests/ops/test_quant_ops.py (built by fold-qdq; native against the unfused reference)",
    "qlinear_matmul_float": "tests/quant/test_int8_kernels.py (built by fold-qdq; bit for bit against the reference)",
    "quantize_linear": "tests/ops/test_quant_ops.py (the quantization ops are outside the core op list)",
    "shape": "tests/ops/test_shape.py (single-op cases fold to constants at import)",
    "size": "tests/ops/test_shape.py (single-op cases fold to constants at import)",
}


@functools.cache
def samples() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    if not os.path.isdir(NODE_DIR):
        return out
    for case in case_dirs(NODE_DIR):
        name = os.path.basename(case)
        if "_expanded" in name:
            continue
        model = onnx.load(os.path.join(case, "model.onnx"))
        if not in_core_scope(name, model):
            continue
        try:
            g = load_onnx(model)
        except CuvilError:
            continue
        ops = {n.op for n in g.nodes} - {"constant"}
        if len(ops) == 1:
            op = ops.pop()
            if len(out[op]) < SAMPLES_PER_OP:
                out[op].append(case)
    return out


@pytest.mark.skipif(not os.path.isdir(NODE_DIR), reason="conformance data not found beside the repo")
@pytest.mark.parametrize("op", sorted(cuvil.ops.all_ops()))
def test_reference_agrees_with_inference(op: str) -> None:
    if op in COVERED_ELSEWHERE:
        pytest.skip(f"{op} is checked in {COVERED_ELSEWHERE[op]}")
    cases = samples().get(op)
    assert cases, f"op {op!r} has no single-op conformance sample; add one or a dedicated test"
    for case in cases:
        model, inputs, _ = load_case(case)
        assert isinstance(model, onnx.ModelProto)
        data = randomized_inputs(inputs, seed=len(case))
        g = load_onnx(model)
        with np.errstate(all="ignore"):
            static_out = run_graph(g, data, check_types=True)

        sym_model, env = symbolic_dims(model)
        try:
            sg = load_onnx(sym_model)
        except CuvilError as exc:
            pytest.fail(f"{os.path.basename(case)}: inference fails with symbolic dims {sorted(env)}: {exc}")
        with np.errstate(all="ignore"):
            sym_out = run_graph(sg, data, check_types=True)
        for v, a, b in zip(sg.outputs, sym_out, static_out):
            assert a.shape == b.shape
            for axis, (d, n) in enumerate(zip(v.type.shape, a.shape)):
                if is_unknown(d):
                    continue
                assert evaluate(d, env) == n, (
                    f"{os.path.basename(case)}: output {v.name!r} dim {axis} infers {d} = {evaluate(d, env)}, "
                    f"reference gives {n}"
                )
