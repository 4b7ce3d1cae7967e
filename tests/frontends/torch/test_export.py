"""cuvil.compile on PyTorch modules: input specs, torch tensors in and out, eval mode, constants,
unsupported ops and torch.export's refusals."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import cuvil
from cuvil.ir.symbolic import sym
from cuvil.metrics import relative_l2
from cuvil.runtime.torch_io import numpy_to_tensor, tensor_to_numpy

TOL = 1e-5  # relative L2, fp32


class Affine(nn.Module):
    """A parameter, a persistent and a non-persistent buffer, a lifted constant; two inputs, dict output."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.scale = nn.Parameter(torch.randn(16, generator=g))
        self.register_buffer("shift", torch.randn(16, generator=g))
        self.register_buffer("extra", torch.randn(16, generator=g), persistent=False)
        self.const = torch.tensor([0.5])  # a plain tensor attribute: torch.export lifts it as a constant

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        z = x * self.scale + self.shift * self.const
        return {"z": z - self.extra, "dot": (z * y).sum(-1)}


def eager(model: nn.Module, *args: torch.Tensor) -> dict[str, np.ndarray]:
    with torch.no_grad():
        return {k: v.numpy() for k, v in model(*args).items()}


@pytest.fixture(scope="module")
def affine() -> nn.Module:
    return Affine().eval()


@pytest.fixture(scope="module")
def compiled(affine: nn.Module) -> cuvil.CompiledModel:
    batch = Dim("batch", min=1, max=32)
    return cuvil.compile(affine, input_spec=[torch.randn(2, 16), torch.randn(2, 16)],
                         dynamic_shapes=({0: batch}, {0: batch}), target="ref")


def test_example_tensors_with_dims(compiled: cuvil.CompiledModel, affine: nn.Module) -> None:
    assert compiled.input_names == ["x", "y"]
    assert compiled.output_names == ["z", "dot"]  # the keys of the model's dict result
    assert [s.shape for s in compiled.input_specs] == [(sym("batch"), 16)] * 2
    assert compiled.info.source_kind == "pytorch module"
    x, y = torch.randn(5, 16), torch.randn(5, 16)
    got = compiled.run({"x": x.numpy(), "y": y.numpy()})
    want = eager(affine, x, y)
    for k in ("z", "dot"):
        assert relative_l2(got[k], want[k]) < TOL


def test_torch_in_torch_out(compiled: cuvil.CompiledModel, affine: nn.Module) -> None:
    x, y = torch.randn(3, 16), torch.randn(3, 16)
    z, dot = compiled(x, y)
    assert isinstance(z, torch.Tensor) and isinstance(dot, torch.Tensor)
    assert relative_l2(z.numpy(), eager(affine, x, y)["z"]) < TOL
    # NumPy in, NumPy out; a tensor that requires grad, and a strided one, are read as they are
    assert all(isinstance(o, np.ndarray) for o in compiled(x.numpy(), y.numpy()))
    xs = torch.randn(16, 3).t()
    xg = torch.randn(3, 16, requires_grad=True)
    z2, _ = compiled(xs, xg)
    assert relative_l2(z2.numpy(), eager(affine, xs, xg.detach())["z"]) < TOL


def test_torch_io_shares_memory() -> None:
    t = torch.randn(4, 5)
    a = tensor_to_numpy(t)
    assert a.ctypes.data == t.data_ptr()  # zero-copy in
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert numpy_to_tensor(out).data_ptr() == out.ctypes.data  # zero-copy out
    b = torch.randn(3, 2).to(torch.bfloat16)
    ab = tensor_to_numpy(b)
    assert ab.dtype.name == "bfloat16" and ab.ctypes.data == b.data_ptr()
    back = numpy_to_tensor(ab)
    assert back.dtype is torch.bfloat16 and torch.equal(back, b)


def test_tensor_specs_as_keyword_inputs(affine: nn.Module) -> None:
    spec = {"x": cuvil.TensorSpec(("n", 16), "float32"), "y": cuvil.TensorSpec(("n", 16), torch.float32)}
    m = cuvil.compile(affine, input_spec=spec, dims={"n": (1, 8)})
    assert m.input_names == ["x", "y"]
    assert m.symbols["n"].min == 1 and m.symbols["n"].max == 8
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    got = m.run({"x": x, "y": y})
    assert relative_l2(got["dot"].numpy(), eager(affine, x, y)["dot"]) < TOL
    with pytest.raises(cuvil.InputError, match="n=9 is above its maximum 8"):
        m(torch.zeros(9, 16), torch.zeros(9, 16))


def test_static_example_and_options(affine: nn.Module) -> None:
    m = cuvil.compile(affine, input_spec=[torch.randn(2, 16), torch.randn(2, 16)], enable_fusion=True)
    assert [s.shape for s in m.input_specs] == [(2, 16), (2, 16)]
    assert any("nothing is fused" in n for n in m.info.notes)  # accepted; the ref target runs no passes
    assert not cuvil.compile(affine, input_spec=[torch.randn(2, 16)] * 2, enable_fusion=False).info.notes
    with pytest.raises(cuvil.InputError, match="dim 0 must be 2"):
        m(np.zeros((3, 16), np.float32), np.zeros((3, 16), np.float32))


def test_single_and_tuple_outputs_are_named() -> None:
    class Two(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + 1, x * 2

    class One(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x - 1

    assert cuvil.compile(Two().eval(), input_spec=[torch.randn(3)]).output_names == ["output_0", "output_1"]
    one = cuvil.compile(One().eval(), input_spec=torch.randn(3))
    assert one.output_names == ["output"]
    np.testing.assert_array_equal(one(np.ones(3, np.float32))[0], np.zeros(3, np.float32))


def test_weights_are_copied_and_the_module_is_not_kept() -> None:
    model = Affine().eval()
    ref = weakref.ref(model)
    x, y = torch.randn(2, 16), torch.randn(2, 16)
    want = eager(model, x, y)["z"]
    m = cuvil.compile(model, input_spec=[x, y])
    with torch.no_grad():
        model.scale.mul_(2.0)  # changing the module afterwards must not change the compiled model
    assert relative_l2(m(x, y)[0].numpy(), want) < TOL
    del model
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("where", ["root", "dropout", "batchnorm"])
def test_training_mode_is_refused(where: str) -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.BatchNorm1d(4)).eval()
    {"root": model, "dropout": model[1], "batchnorm": model[2]}[where].train()
    with pytest.raises(cuvil.ModelError) as info:
        cuvil.compile(model, input_spec=[torch.randn(2, 4)])
    text = str(info.value)
    assert "training mode" in text and "call model.eval()" in text.lower()
    assert {"root": "'Sequential'", "dropout": "'1'", "batchnorm": "'2'"}[where] in text


def test_unsupported_ops_are_listed_with_their_source_lines() -> None:
    class Odd(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = torch.linalg.det(x)  # line A
            e = torch.special.bessel_j0(x)  # line B
            return d.unsqueeze(-1).unsqueeze(-1) + e + torch.special.bessel_j0(x)

    with pytest.raises(cuvil.UnsupportedOpError) as info:
        cuvil.compile(Odd().eval(), input_spec=[torch.randn(2, 3, 3)])
    err = info.value
    text = str(err)
    ops = {u.op_type for u in err.uses}
    assert "aten.special_bessel_j0.default" in ops
    assert any("det" in op for op in ops)
    import inspect

    lines, start = inspect.getsourcelines(Odd.forward)
    line_b = start + next(i for i, s in enumerate(lines) if "line B" in s)
    bessel = next(u for u in err.uses if u.op_type == "aten.special_bessel_j0.default")
    assert len(bessel.nodes) == 2  # both uses, each with where it came from
    assert f"{__file__}:{line_b}" in text


def test_torch_export_refusal_is_explained() -> None:
    class NeedsFour(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(4, -1)

    with pytest.raises(cuvil.ModelError) as info:
        cuvil.compile(NeedsFour().eval(), input_spec=[torch.randn(4, 6)], dynamic_shapes=[{0: Dim("rows")}])
    text = str(info.value)
    assert text.startswith("torch.export could not export the model")
    assert "rows" in text  # torch's explanation names the Dim it could not keep dynamic


def test_input_spec_errors(affine: nn.Module, tmp_path: object) -> None:
    with pytest.raises(cuvil.CuvilError, match="needs input_spec"):
        cuvil.compile(affine)
    with pytest.raises(cuvil.CuvilError, match=r"expected a torch\.Tensor, a NumPy array or a cuvil\.TensorSpec"):
        cuvil.compile(affine, input_spec=[[1.0, 2.0], torch.randn(2, 16)])
    with pytest.raises(cuvil.CuvilError, match=r"either in cuvil\.TensorSpec shapes or in dynamic_shapes"):
        cuvil.compile(affine, input_spec=[cuvil.TensorSpec(("n", 16)), cuvil.TensorSpec(("n", 16))],
                      dynamic_shapes=({0: Dim("n")}, {0: Dim("n")}))
    from cuvil.ir.builder import Builder
    from cuvil.ir.types import TensorType

    b = Builder()
    b.output(b.add1("relu", [b.input("x", TensorType(cuvil.ir.dtypes.DType.f32, (2,)))]))
    with pytest.raises(cuvil.CuvilError, match="input_spec and dynamic_shapes apply to PyTorch models"):
        cuvil.compile(b.graph, input_spec=[torch.randn(2)])


def test_tensor_spec_forms() -> None:
    s = cuvil.TensorSpec(("batch", 3, "32*h"), "float32", name="image")
    assert s.name == "image" and s.dtype == "f32" and s.shape == (sym("batch"), 3, 32 * sym("h"))
    assert cuvil.TensorSpec((2,), torch.int64).dtype == "i64"
    assert cuvil.TensorSpec((2,), np.float16).dtype == "f16"
    with pytest.raises(TypeError, match="unknown element type"):
        cuvil.TensorSpec((2,), "complex64")
    with pytest.raises(TypeError, match="negative"):
        cuvil.TensorSpec((-1,), "float32")


def test_exported_program_is_accepted() -> None:
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    ep = torch.export.export(Double(), (torch.randn(3, 4),), dynamic_shapes=({0: Dim.AUTO},))
    m = cuvil.compile(ep)
    # torch chose the dim to be dynamic without a name: it is named after the input and axis
    assert m.input_specs[0].shape == (sym("x_dim0"), 4)
    x = torch.randn(5, 4)
    assert torch.equal(m(x)[0], x * 2)
    with pytest.raises(cuvil.CuvilError, match="already fixes its inputs"):
        cuvil.compile(ep, input_spec=[x])


def test_state_mutation_is_refused() -> None:
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return x + self.calls

    with pytest.raises(cuvil.ModelError, match=r"changes its state when it runs \(buffer_mutation of 'calls'\)"):
        cuvil.compile(Counter().eval(), input_spec=[torch.randn(2)])


def test_compile_notes_survive_json() -> None:
    info = cuvil.CompileInfo("m", "pytorch module", "00", 1.0, None, "2026-01-01T00:00:00+00:00", ("a note",))
    assert cuvil.CompileInfo.from_json(info.to_json()) == info
    assert cuvil.CompileInfo.from_json({k: v for k, v in info.to_json().items() if k != "notes"}).notes == ()


@pytest.mark.slow  # exports a model of real size and builds it: tens of seconds
def test_large_linear_weights_are_not_transposed_per_call(tmp_path: object) -> None:
    """``nn.Linear`` over a sequence and ``x @ w.T`` are matmuls of a transposed weight (core ATen
    would give ``addmm(bias, x, permute(weight))``); no transpose may be left to run on every call,
    even for weights above fold-constants' size cap (1M elements), and the weights are stored once."""

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(1100, 1000)
            self.w = nn.Parameter(torch.randn(1000, 1100) * 0.01)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x) + x @ self.w.T

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 3, 1100)
    m = cuvil.compile(torch.export.export(model, (x,)), "native", cache_dir=str(tmp_path))
    assert m.graph is not None
    ops = [n.op for n in m.graph.nodes]
    assert "transpose" not in ops, ops
    weights = sum(np.asarray(n.attrs["value"]).nbytes for n in m.graph.nodes if n.op == "constant")
    assert weights < 2 * 1100 * 1000 * 4 + 100_000, weights
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(m(x.numpy())[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # exports a model of real size and builds it: tens of seconds
def test_transformer_products_fuse_from_torch_export(tmp_path: object) -> None:
    """Linear layers over sequences and attention's batched products reach the fusion passes whole
    (not as reshape -> addmm/bmm -> reshape): attention is one op per layer, and every product
    takes its bias, GELU and residual add as epilogues."""
    from collections import Counter

    from tests.support.zoo.networks import transformer_encoder

    model = transformer_encoder()
    tokens = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(0))
    m = cuvil.compile(torch.export.export(model, (tokens,)), "native", cache_dir=str(tmp_path))
    assert m.graph is not None
    ops = Counter(n.op for n in m.graph.nodes)
    assert ops["attention"] == 2, ops
    assert not ops.keys() & {"gemm", "matmul", "gelu", "softmax"}, ops
    with torch.no_grad():
        want = model(tokens).numpy()
    got = m(tokens.numpy())[0]
    assert relative_l2(got, want) <= 1e-5


@pytest.mark.slow  # exports a model of real size and builds it: tens of seconds
def test_a_tied_output_layer_is_not_transposed_per_call(tmp_path: object) -> None:
    """An output layer sharing the embedding's weight (above fold-constants' size cap): the weight
    is read as it is by the lookup and transposed by the product; the transpose folds."""

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(4100, 256)
            self.head = nn.Linear(256, 4100, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(torch.tanh(self.emb(ids)))

    torch.manual_seed(0)
    model = Model().eval()
    ids = torch.randint(0, 4100, (1, 7))
    m = cuvil.compile(torch.export.export(model, (ids,)), "native", cache_dir=str(tmp_path))
    assert m.graph is not None
    assert "transpose" not in [n.op for n in m.graph.nodes]
    with torch.no_grad():
        want = model(ids).numpy()
    np.testing.assert_allclose(m(ids.numpy())[0], want, rtol=1e-4, atol=1e-4)
