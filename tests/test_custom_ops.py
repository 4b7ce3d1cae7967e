"""Custom ops: cuvil.register_op's checks, its C kernels, and the ONNX and PyTorch mappings onto it.

Oracles: the op's NumPy reference for ONNX models and Cuvil graphs, eager PyTorch for torch models;
float32 results must match within 1e-5 (the kernels compute the same float expression, so they agree
exactly in practice). Every registration is undone at the end of its test (context manager).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil import Arg, CustomOpError, OpSchema
from cuvil.custom import custom_op, custom_ops
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.metrics import relative_l2
from cuvil.ops import registry
from tests.support.paths import REPO

TOL = 1e-5

SCALE_ADD_C = r"""
int cuviltest_scale_add(const cuvil_tensor *inputs, int n_inputs, cuvil_tensor *outputs, int n_outputs,
                        const cuvil_custom_attr *attrs) {
    (void)n_inputs; (void)n_outputs;
    const cuvil_tensor *x = &inputs[0], *y = &inputs[1];
    if (!cuvil_same_shape(x->shape, x->rank, y->shape, y->rank)) return 7;
    const float *a = (const float *)x->data, *b = (const float *)y->data;
    float *out = (float *)outputs[0].data;
    float alpha = (float)attrs[0].f;
    int64_t n = cuvil_numel(x->shape, x->rank);
    for (int64_t i = 0; i < n; i++) out[i] = a[i] + alpha * b[i];
    return 0;
}
"""


def scale_add(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    return (x + np.float32(alpha) * y).astype(np.float32)


def scale_add_schema(**kw: object) -> OpSchema:
    args: dict[str, object] = {
        "inputs": [Arg("x", 2), Arg("y", 2)],
        "outputs": [Arg("out", 2)],
        "shape": lambda x, y, alpha: [x],
        "attrs": {"alpha": 1.0},
    }
    args.update(kw)
    return OpSchema(**args)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


@pytest.fixture
def scale_add_op() -> Iterator[cuvil.CustomOp]:
    with cuvil.register_op("cuviltest::scale_add", schema=scale_add_schema(), reference=scale_add,
                           c_source=SCALE_ADD_C) as op:
        yield op
    assert custom_op("cuviltest::scale_add") is None and registry.lookup("cuviltest::scale_add") is None


def onnx_model(domain: str = "cuviltest", op_type: str = "scale_add", batch2: str = "batch", **attrs: object) -> bytes:
    """x, y -> Relu(domain::op_type(x, y)) with a symbolic batch."""
    nodes = [helper.make_node(op_type, ["x", "y"], ["s"], domain=domain, name="custom", **attrs),
             helper.make_node("Relu", ["s"], ["out"], name="relu")]
    graph = helper.make_graph(
        nodes, "custom_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch2, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)])
    return model.SerializeToString()


# a correct registration, used by models ---------------------------------------------------------------
def test_registration_makes_an_ordinary_op(scale_add_op: cuvil.CustomOp) -> None:
    opdef = registry.get("cuviltest::scale_add")
    assert opdef is scale_add_op.opdef and opdef.inputs == ("x", "y") and opdef.outputs == ("out",)
    assert opdef.attrs["alpha"].kind == "float" and opdef.attrs["alpha"].default == 1.0
    assert scale_add_op.c_function == "cuviltest_scale_add"
    assert "cuviltest::scale_add" in custom_ops()


@pytest.mark.parametrize("target", ["ref", "native"])
def test_onnx_custom_domain(scale_add_op: cuvil.CustomOp, target: str, cache: str) -> None:
    m = cuvil.compile(onnx_model(alpha=0.5), target=target, dims={"batch": (1, 64)}, cache_dir=cache)
    rng = np.random.default_rng(0)
    for batch in (1, 5, 64):
        x, y = (rng.standard_normal((batch, 8)).astype(np.float32) for _ in range(2))
        (out,) = m(x, y)
        np.testing.assert_allclose(out, np.maximum(scale_add(x, y, 0.5), 0), rtol=TOL, atol=TOL)
    with pytest.raises(cuvil.InputError, match="batch=65 is above its maximum 64"):
        m(np.zeros((65, 8), np.float32), np.zeros((65, 8), np.float32))


def test_onnx_attribute_default_and_int_to_float(scale_add_op: cuvil.CustomOp, cache: str) -> None:
    x, y = np.ones((2, 8), np.float32), np.full((2, 8), 2.0, np.float32)
    (out,) = cuvil.compile(onnx_model(), target="native", cache_dir=cache)(x, y)  # alpha defaults to 1.0
    np.testing.assert_allclose(out, 3.0)
    (out,) = cuvil.compile(onnx_model(alpha=3), target="ref")(x, y)  # an int attribute fills a float one
    np.testing.assert_allclose(out, 7.0)


def test_onnx_undeclared_attribute_is_refused(scale_add_op: cuvil.CustomOp) -> None:
    with pytest.raises(cuvil.ModelError, match=r"attribute\(s\) beta are not declared by custom op cuviltest::scale_add"):
        cuvil.compile(onnx_model(beta=2.0), target="ref")


def test_kernel_failure_names_the_node(scale_add_op: cuvil.CustomOp, cache: str) -> None:
    """Different batch symbols: the kernel's own shape check fails the call, through the generated check."""
    m = cuvil.compile(onnx_model(batch2="other"), target="native", cache_dir=cache)
    with pytest.raises(cuvil.CuvilError, match=r"node custom \(cuviltest::scale_add\): custom kernel "
                                               r"cuviltest_scale_add returned 7"):
        m(np.zeros((2, 8), np.float32), np.zeros((3, 8), np.float32))


def test_saved_artifact_runs_without_the_registration(tmp_path: Path, cache: str) -> None:
    x, y = np.ones((2, 8), np.float32), np.ones((2, 8), np.float32)
    with cuvil.register_op("cuviltest::scale_add", schema=scale_add_schema(), reference=scale_add,
                           c_source=SCALE_ADD_C):
        cuvil.compile(onnx_model(alpha=0.25), target="native", cache_dir=cache).save(tmp_path / "art")
    assert "cuviltest_scale_add" in (tmp_path / "art" / "model.c").read_text()
    (out,) = cuvil.load(tmp_path / "art")(x, y)
    np.testing.assert_allclose(out, 1.25)


ROW_STATS_C = r"""
#define ROW_STATS(T)                                                             \
    {                                                                            \
        const T *x = (const T *)inputs[0].data;                                  \
        T *lo = (T *)outputs[0].data, *hi = (T *)outputs[1].data;                \
        for (int64_t r = 0; r < n; r++) {                                        \
            T a = x[r * k], b = x[r * k];                                        \
            for (int64_t j = 1; j < k; j++) {                                    \
                T v = x[r * k + j];                                              \
                a = v < a ? v : a;                                               \
                b = v > b ? v : b;                                               \
            }                                                                    \
            lo[r] = a * (T)attrs[0].i;                                           \
            hi[r] = b * (T)attrs[0].i;                                           \
        }                                                                        \
    }

int cuviltest_row_stats(const cuvil_tensor *inputs, int n_inputs, cuvil_tensor *outputs, int n_outputs,
                        const cuvil_custom_attr *attrs) {
    (void)n_inputs; (void)n_outputs;
    int64_t n = inputs[0].shape[0], k = inputs[0].shape[1];
    if (k == 0) return 1;
    if (inputs[0].dtype == CUVIL_F32) ROW_STATS(float)
    else if (inputs[0].dtype == CUVIL_F64) ROW_STATS(double)
    else return 2;
    return 0;
}
"""


def row_stats(x: np.ndarray, scale: int) -> tuple[np.ndarray, np.ndarray]:
    return x.min(axis=1) * x.dtype.type(scale), x.max(axis=1) * x.dtype.type(scale)


def test_two_outputs_two_dtypes_and_an_int_attribute(cache: str) -> None:
    schema = OpSchema(
        inputs=[Arg("x", 2, ("f32", "f64"))],
        outputs=[Arg("lo", 1, ("f32", "f64")), Arg("hi", 1, ("f32", "f64"))],
        shape=lambda x, scale: [(x[0],), (x[0],)],
        dtype=lambda x, scale: [x, x],
        attrs={"scale": int},
    )
    with cuvil.register_op("cuviltest::row_stats", schema=schema, reference=row_stats, c_source=ROW_STATS_C):
        for dt in (DType.f32, DType.f64):
            g = Graph(name="stats", symbols={"n": SymbolInfo("n", 1, 100)})
            b = Builder(g)
            x = b.input("x", TensorType(dt, (sym("n"), 5)))
            g.outputs.extend(b.add("cuviltest::row_stats", [x], {"scale": 3}, num_outputs=2))
            assert [str(v.type) for v in g.outputs] == [f"{dt}[n]", f"{dt}[n]"]
            a = np.random.default_rng(1).standard_normal((7, 5)).astype(dt.np)
            want = row_stats(a, 3)
            for target in ("ref", "native"):
                got = cuvil.compile(g, target=target, cache_dir=cache)(a)
                for gv, wv in zip(got, want):
                    assert gv.dtype == dt.np
                    np.testing.assert_allclose(gv, wv, rtol=TOL, atol=TOL)


@pytest.mark.slow
def test_wasm32_compiles_the_same_kernel(scale_add_op: cuvil.CustomOp, cache: str) -> None:
    pytest.importorskip("ziglang")
    pytest.importorskip("wasmtime")
    m = cuvil.compile(onnx_model(alpha=-2.0), target="wasm32", cache_dir=cache)
    x, y = (np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32) for _ in range(2))
    (out,) = m(x, y)
    np.testing.assert_allclose(out, np.maximum(scale_add(x, y, -2.0), 0), rtol=TOL, atol=TOL)


# each kind of mismatch is refused, naming it, and leaves nothing registered --------------------------
def _refused(name: str, kind: str, pattern: str, **kw: object) -> CustomOpError:
    args: dict[str, object] = {"schema": scale_add_schema(), "reference": scale_add}
    args.update(kw)
    with pytest.raises(CustomOpError, match=pattern) as info:
        cuvil.register_op(name, **args)  # type: ignore[arg-type]
    assert info.value.kind == kind, info.value
    assert custom_op(name) is None and registry.lookup(name) is None
    return info.value


def test_shape_function_disagreeing_with_the_reference() -> None:
    schema = OpSchema(inputs=[Arg("x", 2)], outputs=[Arg("out", 1)], shape=lambda x: [(x[1],)])
    _refused("cuviltest::row_sum", "shape", re.escape(
        "register_op('cuviltest::row_sum'): shape mismatch: on x: f32[3, 2] the shape function gives output 'out' "
        "shape [2], the reference returns [3]"), schema=schema, reference=lambda x: x.sum(axis=1))


def test_shape_function_rank_disagreeing_with_the_schema() -> None:
    _refused("cuviltest::scale_add", "shape", "the shape function gives output 'out' rank 1 \\(\\[3\\]\\), the schema "
             "declares rank 2", schema=scale_add_schema(shape=lambda x, y, alpha: [(x[0],)]))


def test_shape_function_must_take_symbolic_dims() -> None:
    schema = OpSchema(inputs=[Arg("x", 1)], outputs=[Arg("out", 1)], shape=lambda x: [(max(int(x[0]) - 1, 0),)])
    _refused("cuviltest::drop_last", "shape", r"on symbolic dims \(x: \[x_0\]\).*no int\(\), no comparisons",
             schema=schema, reference=lambda x: x[:-1])


def test_reference_dtype_disagreeing_with_the_schema() -> None:
    _refused("cuviltest::scale_add", "dtype", "on x: f32\\[3, 3\\], y: f32\\[3, 3\\] the reference returns output "
             "'out' as f64, the schema says f32", reference=lambda x, y, alpha: x.astype(np.float64) + alpha * y)


def test_dtype_function_outside_the_declared_dtypes() -> None:
    schema = scale_add_schema(outputs=[Arg("out", 2, ("f32", "f64"))], dtype=lambda x, y, alpha: ["f16"])
    _refused("cuviltest::scale_add", "dtype", "the dtype function gives output 'out' f16, which is not among its "
             "declared dtypes \\(f32, f64\\)", schema=schema)


def test_output_with_several_dtypes_needs_a_dtype_function() -> None:
    _refused("cuviltest::scale_add", "declaration", "output 'out' allows f32, f64: declare one dtype",
             schema=scale_add_schema(outputs=[Arg("out", 2, ("f32", "f64"))]))


def test_c_kernel_disagreeing_with_the_reference() -> None:
    wrong = SCALE_ADD_C.replace("a[i] + alpha * b[i]", "a[i] + alpha * b[i] + (i == 4 ? 0.5f : 0.0f)")
    err = _refused("cuviltest::scale_add", "c_kernel", "on x: f32\\[3, 3\\], y: f32\\[3, 3\\] the C kernel's output "
                   "'out' differs from the reference in 1 of 9 elements \\(tolerance 1e-05, max abs error 0.5\\); "
                   "first at index \\[1, 1\\]", c_source=wrong)
    assert "C gives" in str(err)


def test_c_kernel_tolerance_is_the_users() -> None:
    off = SCALE_ADD_C.replace("a[i] + alpha * b[i]", "a[i] + alpha * b[i] + 1e-4f")
    with cuvil.register_op("cuviltest::scale_add", schema=scale_add_schema(), reference=scale_add, c_source=off,
                           tolerance=1e-3):
        pass
    _refused("cuviltest::scale_add", "c_kernel", "differs from the reference in 18 of 18", c_source=off,
             tolerance=1e-5, samples=[(np.ones((3, 6), np.float32), np.ones((3, 6), np.float32))])


def test_c_kernel_that_does_not_compile_points_at_its_line() -> None:
    broken = SCALE_ADD_C.replace("return 0;", "return 0")
    line = broken.rstrip().split("\n").index("    return 0") + 1
    _refused("cuviltest::scale_add", "c_kernel", f"the C source does not compile:(.|\\n)*c_source:{line}:\\d+: error",
             c_source=broken)


def test_c_kernel_with_another_name_or_signature() -> None:
    _refused("cuviltest::scale_add", "c_kernel", "does c_source define cuviltest_scale_add",
             c_source=SCALE_ADD_C.replace("int cuviltest_scale_add(", "int other_name("))
    _refused("cuviltest::scale_add", "c_kernel", "conflicting types for .cuviltest_scale_add",
             c_source=SCALE_ADD_C.replace("int n_inputs,", "int64_t n_inputs,"))


def test_c_kernel_reporting_failure_on_the_samples() -> None:
    _refused("cuviltest::scale_add", "c_kernel", "the C kernel fails on x: f32\\[3, 3\\], y: f32\\[3, 3\\]: node "
             "cuviltest::scale_add \\(cuviltest::scale_add\\): custom kernel cuviltest_scale_add returned 7",
             c_source=SCALE_ADD_C.replace("return 0;", "return 7;"))


def test_backward_gradient_shape_and_count() -> None:
    def wrong_shape(x: np.ndarray, y: np.ndarray, grad_out: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
        return grad_out, grad_out.sum(axis=0)

    _refused("cuviltest::scale_add", "backward", "on x: f32\\[3, 3\\], y: f32\\[3, 3\\] the gradient for input 'y' is "
             "f32\\[3\\], the input is f32\\[3, 3\\]", backward=wrong_shape)

    def wrong_dtype(x: np.ndarray, y: np.ndarray, grad_out: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
        return grad_out, grad_out.astype(np.float64)

    _refused("cuviltest::scale_add", "backward", "the gradient for input 'y' is f64\\[3, 3\\], the input is "
             "f32\\[3, 3\\]", backward=wrong_dtype)

    def one_grad(x: np.ndarray, y: np.ndarray, grad_out: np.ndarray, alpha: float) -> np.ndarray:
        return grad_out

    _refused("cuviltest::scale_add", "backward", "it returns 1 gradients; it must return one per forward input "
             "\\(x, y\\)", backward=one_grad)


def test_backward_names_must_match_its_signature() -> None:
    def renamed(x: np.ndarray, y: np.ndarray, g: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
        return g, g

    _refused("cuviltest::scale_add", "backward", re.escape(
        "its parameters (x, y, g) do not match the declared gradient inputs (x, y, grad_out)"), backward=renamed)
    _refused("cuviltest::scale_add", "backward", "declared gradient input 'grad_z' is none of the forward inputs",
             schema=scale_add_schema(backward_inputs=["grad_z"]), backward=renamed)


def test_backward_with_declared_inputs() -> None:
    def grads(grad_out: np.ndarray, alpha: float) -> tuple[np.ndarray, ...]:
        return grad_out, (np.float32(alpha) * grad_out).astype(np.float32)

    schema = scale_add_schema(backward_inputs=["grad_out"])
    with cuvil.register_op("cuviltest::scale_add", schema=schema, reference=scale_add, backward=grads) as op:
        assert op.backward is grads and op.c_function is None


def test_declaration_errors() -> None:
    _refused("scale_add", "declaration", "a custom op is named 'namespace::name'")
    _refused("aten::scale_add", "declaration", "namespace 'aten' is reserved")
    _refused("cuviltest::scale_add", "declaration", r"the reference <lambda>\(x, y\) cannot take the declared inputs "
             r"\(x, y\) and attributes \(alpha\)", reference=lambda x, y: x)
    _refused("cuviltest::scale_add", "declaration", "output name 'x' is used twice",
             schema=scale_add_schema(outputs=[Arg("x", 2)]))
    _refused("cuviltest::scale_add", "declaration", "input 'x' has rank 9; ranks are 0 to 8",
             schema=scale_add_schema(inputs=[Arg("x", 9), Arg("y", 2)]))
    _refused("cuviltest::scale_add", "declaration", "unknown element type 'f17'",
             schema=scale_add_schema(inputs=[Arg("x", 2, ("f17",)), Arg("y", 2)]))
    _refused("cuviltest::scale_add", "declaration", r"sample 0, input 'x' is i64\[2, 2\]; the schema takes rank 2, f32",
             samples=[(np.zeros((2, 2), np.int64), np.zeros((2, 2), np.float32))])
    _refused("cuviltest::scale_add", "reference", "the reference fails on x: f32\\[3, 3\\], y: f32\\[3, 3\\]: "
             "ValueError: nope; pass samples=", reference=_raises)


def _raises(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    raise ValueError("nope")


def test_names_are_registered_once(scale_add_op: cuvil.CustomOp) -> None:
    _refused_again = pytest.raises(CustomOpError, match="already registered")
    with _refused_again:
        cuvil.register_op("cuviltest::scale_add", schema=scale_add_schema(), reference=scale_add)
    with pytest.raises(CustomOpError, match="a built-in op has this name"):
        registry.register(registry.OpDef(name="cuviltest::builtin", inputs=("X",), infer=lambda c: [], reference=None))
        try:
            cuvil.register_op("cuviltest::builtin", schema=scale_add_schema(), reference=scale_add)
        finally:
            registry.unregister("cuviltest::builtin")
    with pytest.raises(CustomOpError, match="c_function 'cuviltest_scale_add' is already the kernel of"):
        cuvil.register_op("cuviltest::other", schema=scale_add_schema(), reference=scale_add, c_source=SCALE_ADD_C,
                          c_function="cuviltest_scale_add")
    # a failed replacement keeps the op it was to replace
    with pytest.raises(CustomOpError, match="c_kernel"):
        cuvil.register_op("cuviltest::scale_add", schema=scale_add_schema(), reference=scale_add, replace=True,
                          c_source=SCALE_ADD_C.replace("return 0;", "return 1;"))
    assert custom_op("cuviltest::scale_add") is scale_add_op and registry.get("cuviltest::scale_add") is scale_add_op.opdef


def test_unregistered_custom_domain_is_unsupported() -> None:
    with pytest.raises(cuvil.UnsupportedOpError, match=re.escape(
            "unsupported ops (1): cuviltest::not_registered (opset 1); used by 'custom'")):
        cuvil.compile(onnx_model(op_type="not_registered"), target="ref")


# PyTorch: torch.library.custom_op ---------------------------------------------------------------------
torch = pytest.importorskip("torch")


@torch.library.custom_op("cuviltest::scale_add", mutates_args=())
def _torch_scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return x + alpha * y


@_torch_scale_add.register_fake
def _(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("cuviltest::not_registered", mutates_args=())
def _torch_not_registered(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_torch_not_registered.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Blend(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.ops.cuviltest.scale_add(x @ self.w, y, alpha=0.5)


@pytest.mark.parametrize("target", ["ref", "native"])
def test_torch_custom_op(scale_add_op: cuvil.CustomOp, target: str, cache: str) -> None:
    torch.manual_seed(0)
    model = Blend().eval()
    batch = torch.export.Dim("batch", min=1, max=32)
    m = cuvil.compile(model, input_spec=[torch.randn(4, 8), torch.randn(4, 8)], target=target, cache_dir=cache,
                      dynamic_shapes={"x": {0: batch}, "y": {0: batch}})
    for n in (1, 4, 32):
        x, y = torch.randn(n, 8), torch.randn(n, 8)
        (out,) = m(x, y)
        want = model(x, y).detach()
        assert isinstance(out, torch.Tensor)
        rel = relative_l2(out.numpy(), want.numpy())
        assert rel < TOL, rel


def test_torch_argument_names_must_match(cache: str) -> None:
    schema = scale_add_schema(inputs=[Arg("a", 2), Arg("y", 2)], shape=lambda a, y, alpha: [a])
    with cuvil.register_op("cuviltest::scale_add", schema=schema, reference=lambda a, y, alpha: scale_add(a, y, alpha)), \
            pytest.raises(cuvil.ModelError, match=r"they must match by name \(mismatched: a, x\)"):
        cuvil.compile(Blend().eval(), input_spec=[torch.randn(4, 8), torch.randn(4, 8)], target="ref")


def test_torch_unregistered_custom_op_is_unsupported() -> None:
    class Uses(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.cuviltest.not_registered(x)

    with pytest.raises(cuvil.UnsupportedOpError, match=r"unsupported ops \(1\): .*cuviltest\.not_registered\.default"
                                                       r".*test_custom_ops\.py:\d+") as info:
        cuvil.compile(Uses().eval(), input_spec=[torch.randn(2, 3)], target="ref")
    assert len(info.value.uses) == 1


# the guide ---------------------------------------------------------------------------------------------
def test_guide_code_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Every python block of docs/custom-ops.md, in order, in one namespace (C builds in a private cache)."""
    from cuvil.backends.c import cache as c_cache

    monkeypatch.setattr(c_cache, "default_cache_dir", lambda: tmp_path)
    text = (REPO / "docs" / "custom-ops.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 5
    namespace: dict[str, object] = {"__name__": "custom_ops_guide"}
    try:
        for block in blocks:
            exec(compile(block, "docs/custom-ops.md", "exec"), namespace)
    finally:
        for name in [n for n in custom_ops() if n.startswith("mylib::")]:
            cuvil.unregister_op(name)
    assert "shape mismatch" in capsys.readouterr().out
