"""The compatibility checks (coverage, custom-ops, dynamic-shapes, precision, reproducibility, cross-target).

Each check passes on a correct model and fails, pointing at the right op, node, symbol or output, on a
planted fault.  Faults are planted only through documented hooks: the C backend's kernel table
(``register_custom_kernel`` replacing a custom op's kernel after ``cuvil.register_op`` accepted it, or
an emitter removed with monkeypatch), and a monkeypatched input guard (``bind_inputs``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

import cuvil
import cuvil.verify.checks
from cuvil import Arg, OpSchema
from cuvil.api import import_model
from cuvil.backends.c.kernels.custom import CustomKernel, register_custom_kernel
from cuvil.verify.base import CheckResult, Status, get_check
from cuvil.verify.context import ModelSource, VerifyContext
from tests.support.paths import REPO

TINY = str(REPO / "cuvil" / "examples" / "tiny_cnn.onnx")

SCALE_ADD_C = r"""
int cuvilverify_scale_add(const cuvil_tensor *inputs, int n_inputs, cuvil_tensor *outputs, int n_outputs,
                          const cuvil_custom_attr *attrs) {
    (void)n_inputs; (void)n_outputs;
    const float *a = (const float *)inputs[0].data, *b = (const float *)inputs[1].data;
    float *out = (float *)outputs[0].data;
    float alpha = (float)attrs[0].f;
    int64_t n = cuvil_numel(inputs[0].shape, inputs[0].rank);
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + alpha * b[i];
    return 0;
}
"""
# planted faults: a kernel 0.1% off, and one whose result depends on how often it was called
WRONG_C = SCALE_ADD_C.replace("a[i] + alpha * b[i]", "(a[i] + alpha * b[i]) * 1.001f")
FLAKY_C = SCALE_ADD_C.replace("float alpha", "static int calls; calls++;\n    float alpha").replace(
    "a[i] + alpha * b[i]", "a[i] + alpha * b[i] + (float)(calls % 2) * 1e-3f")


def scale_add(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    return (x + np.float32(alpha) * y).astype(np.float32)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


Context = Callable[..., VerifyContext]


@pytest.fixture(scope="module")
def context(cache: str, tmp_path_factory: pytest.TempPathFactory) -> Context:
    """Makes verification contexts on the module's build cache, each with a work folder of its own:
    ``context(model, targets, kind="onnx", checks=None)``, ``checks`` being the configuration's
    ``[checks.NAME]`` tables."""
    root = tmp_path_factory.mktemp("cuvil-verify-work")

    def make(model: Any, targets: list[str], kind: str = "onnx",
             checks: dict[str, dict[str, Any]] | None = None) -> VerifyContext:
        return VerifyContext(ModelSource(kind, model), targets=targets, cache_dir=cache,
                             work_dir=Path(tempfile.mkdtemp(prefix="cuvil-verify-", dir=root)),
                             config={"checks": checks or {}})

    return make


def run(name: str, ctx: VerifyContext) -> dict[str | None, CheckResult]:
    results = get_check(name)().run(ctx)
    assert all(r.check == name for r in results)
    return {r.target: r for r in results}


def custom_model(op_type: str = "scale_add") -> bytes:
    """x, y -> Relu(cuvilverify::op_type(x, y)), batch 1..8."""
    nodes = [helper.make_node(op_type, ["x", "y"], ["s"], domain="cuvilverify", name="custom", alpha=0.5),
             helper.make_node("Relu", ["s"], ["out"], name="relu")]
    graph = helper.make_graph(nodes, "custom_model",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("cuvilverify", 1)])
    data: bytes = model.SerializeToString()
    return data


@pytest.fixture
def scale_add_op() -> Iterator[cuvil.CustomOp]:
    schema = OpSchema(inputs=[Arg("x", 2), Arg("y", 2)], outputs=[Arg("out", 2)], shape=lambda x, y, alpha: [x],
                      attrs={"alpha": 1.0})
    with cuvil.register_op("cuvilverify::scale_add", schema=schema, reference=scale_add, c_source=SCALE_ADD_C) as op:
        yield op


def plant_kernel(op: cuvil.CustomOp, source: str) -> None:
    """Replace the op's C kernel in the kernel table after registration accepted the right one."""
    register_custom_kernel(CustomKernel(op.name, "cuvilverify_scale_add", source, (("alpha", "float"),)))


# ---- coverage ------------------------------------------------------------------------------------------------
def test_coverage_maps_every_source_node_to_a_kernel(context: Context) -> None:
    results = run("coverage", context(TINY, ["ref", "generic"]))
    assert all(r.status is Status.PASS for r in results.values())
    rows = {r["source_node"]: r for r in results["generic"].details["ops"]}
    assert len(rows) == 10 and rows["conv1"]["source_op"] == "Conv" and rows["conv1"]["cuvil_ops"] == ["conv"]
    assert rows["softmax"]["kernels"] == ["cuvil.backends.c.kernels.softmax._softmax"]
    assert rows["fc"]["source_op"] == "Gemm" and rows["fc"]["cuvil_ops"] == ["gemm"]
    ref_rows = {r["source_node"]: r for r in results["ref"].details["ops"]}
    assert ref_rows["softmax"]["kernels"][0].startswith("cuvil.ops.")


def test_coverage_fails_on_a_missing_kernel_with_its_nodes(context: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import cuvil.backends.c.kernels  # noqa: F401
    from cuvil.backends.c import kernel

    monkeypatch.delitem(kernel._KERNELS, "softmax")
    results = run("coverage", context(TINY, ["ref", "generic"]))
    assert results["ref"].status is Status.PASS
    bad = results["generic"]
    assert bad.status is Status.FAIL and bad.where == {"op": "softmax", "node": "softmax"}
    assert bad.details["missing_kernels"] == {"softmax": ["softmax"]}


def test_coverage_lists_unsupported_ops_instead_of_crashing(context: Context) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("NoSuchOp", ["r"], ["y"], name="mystery1"),
             helper.make_node("NoSuchOp", ["y"], ["z"], name="mystery2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    (r,) = run("coverage", context(model, ["ref"])).values()
    assert r.status is Status.FAIL and r.where == {"op": "NoSuchOp", "node": "mystery1, mystery2"}
    assert r.details["unsupported"][0]["nodes"] == ["mystery1", "mystery2"]


# ---- custom-ops ----------------------------------------------------------------------------------------------
def test_custom_ops_pass_and_skip(scale_add_op: cuvil.CustomOp, context: Context) -> None:
    (r,) = run("custom-ops", context(custom_model(), ["ref"])).values()
    assert r.status is Status.PASS, r.summary
    assert r.details["ops"][0]["op"] == "cuvilverify::scale_add" and r.details["ops"][0]["nodes"] == ["custom"]
    (r,) = run("custom-ops", context(TINY, ["ref"])).values()
    assert r.status is Status.SKIP


def test_custom_ops_catch_a_kernel_broken_after_registration(scale_add_op: cuvil.CustomOp, context: Context) -> None:
    plant_kernel(scale_add_op, WRONG_C)
    (r,) = run("custom-ops", context(custom_model(), ["ref"])).values()
    assert r.status is Status.FAIL
    assert r.where == {"op": "cuvilverify::scale_add", "node": "custom", "check": "c_kernel"}
    assert "differs from the reference" in r.summary


def test_custom_ops_unregistered(context: Context) -> None:
    (r,) = run("custom-ops", context(custom_model("not_there"), ["ref"])).values()
    assert r.status is Status.FAIL and r.where == {"op": "cuvilverify::not_there", "node": "custom"}


# ---- dynamic-shapes ------------------------------------------------------------------------------------------
def constrained(dims: Any) -> Any:
    return import_model(TINY, dims=dims)


def test_dynamic_shapes_boundaries_and_refusals(context: Context) -> None:
    results = run("dynamic-shapes", context(constrained({"batch": cuvil.multiple_of(2, 2, 4096)}),
                                            ["ref", "generic"], kind="graph",
                                            checks={"dynamic-shapes": {"max_elements": 50_000}}))
    for r in results.values():
        assert r.status is Status.PASS, r.summary
        values = {row["value"] for row in r.details["runs"]}
        assert {2, 4, 6} <= values and max(values) * 3 * 32 * 32 <= 50_000 and all(v % 2 == 0 for v in values)
        outcomes = {row["value"]: row["outcome"] for row in r.details["refusals"]}
        assert set(outcomes) == {1, 3, 4097}
        assert outcomes[1].startswith("refused: InputError") and outcomes[3].startswith("refused: InputError")
        assert outcomes[4097].startswith("not run")  # 4097 images are beyond 4 x max_elements
        assert any("max_elements=50000" in n for n in r.details["notes"])


def test_dynamic_shapes_dropped_max_guard(context: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    import cuvil.runtime.compiled as compiled
    from cuvil.runtime.guards import bind_inputs as guard

    def no_max(names: Any, types: Any, arrays: Any, symbols: Any, checks: Any = (), dropped: Any = None) -> dict[str, int]:
        return guard(names, types, arrays, {k: replace(v, max=None) for k, v in symbols.items()}, checks, dropped)

    monkeypatch.setattr(compiled, "bind_inputs", no_max)
    results = run("dynamic-shapes", context(constrained({"batch": (1, 8)}), ["ref", "generic"], kind="graph"))
    ref = results["ref"]
    assert ref.status is Status.FAIL and ref.where == {"symbol": "batch", "value": "9", "case": "above the maximum 8"}
    # the generated C still checks the constraint: refused, but late, by the compiled code
    gen = results["generic"]
    assert gen.status is Status.WARN and gen.where == {"symbol": "batch"} and "refused by the compiled code" in gen.summary


def test_dynamic_shapes_unbounded_symbol_warns_with_a_suggestion(context: Context) -> None:
    (r,) = run("dynamic-shapes", context(TINY, ["ref"], checks={"dynamic-shapes": {"max_elements": 30_720}})).values()
    assert r.status is Status.WARN and r.where == {"symbol": "batch"}
    assert "suggested constraint: --dim batch=1:10" in r.summary


# ---- precision, reproducibility, cross-target ----------------------------------------------------------------
@pytest.mark.slow  # builds a model for several targets, precisions and thread counts: tens of seconds
def test_precision_reproducibility_cross_target_pass(context: Context) -> None:
    # cross-target's default list adds native and wasm32 (when its toolchain imports); two targets keep this fast
    ctx = context(TINY, ["ref", "generic"], checks={"cross-target": {"targets": ["ref", "generic"]}})
    for r in run("precision", ctx).values():
        assert r.status is Status.PASS, r.summary
        assert 0 < r.figures["rel_l2"] < 1e-5 and r.details["baseline"] == "onnxruntime (fp32)"
        assert r.details["precisions"]["fp16"] == ("checked" if r.target == "generic" else
                                                    "not checked: only the C targets compute it")
    rep = run("reproducibility", ctx)
    assert rep["generic"].status is Status.PASS, rep["generic"].summary
    assert set(rep["generic"].details["checked"]) == {"repeated runs", "processes", "thread counts"}
    assert rep["ref"].details["promises"]["processes"].startswith("not applicable")
    (x,) = run("cross-target", ctx).values()
    assert x.status is Status.PASS, x.summary
    labels, matrix = x.details["labels"], np.array(x.details["matrix"])
    assert labels[:2] == ["ref", "generic"] and labels[-1] == "float64 reference"
    assert matrix.shape == (len(labels), len(labels)) and np.allclose(matrix, matrix.T) and np.all(np.diag(matrix) == 0)


def test_precision_and_cross_target_catch_a_wrong_kernel(scale_add_op: cuvil.CustomOp, context: Context) -> None:
    plant_kernel(scale_add_op, WRONG_C)
    ctx = context(custom_model(), ["ref", "generic"], checks={"cross-target": {"targets": ["ref", "generic"]}})
    results = run("precision", ctx)
    assert results["ref"].status is Status.PASS
    bad = results["generic"]
    assert bad.status is Status.FAIL and bad.where == {"output": "out", "node": "relu"}
    assert bad.figures["rel_l2"] > 1e-4 and bad.details["reference"].startswith("reference interpreter in float32")
    (x,) = run("cross-target", ctx).values()
    assert x.status is Status.FAIL and x.where == {"target": "generic", "output": "out", "node": "relu"}


def test_reproducibility_catches_a_call_dependent_kernel(scale_add_op: cuvil.CustomOp, context: Context) -> None:
    plant_kernel(scale_add_op, FLAKY_C)
    ctx = context(custom_model(), ["generic"], checks={"reproducibility": {"processes": False}})
    r = run("reproducibility", ctx)["generic"]
    assert r.status is Status.FAIL and r.where["run"] == "repeated runs" and r.where["output"] == "out"
