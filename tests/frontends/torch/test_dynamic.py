"""Dynamic shapes from torch.export Dims: one compiled model serves every valid shape, and inputs
outside the contract are refused before anything runs, naming the symbol, the constraint and the value."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import cuvil
from cuvil.ir.symbolic import sym
from cuvil.metrics import relative_l2

# every test exports the encoder with dynamic shapes (the module's fixture also builds it natively):
# tens of seconds in all, the slow tier
pytestmark = pytest.mark.slow

FEATURES = 32
TOL = 1e-5  # relative L2, fp32


class TinyEncoder(nn.Module):
    """Linear projection, causal self-attention (two heads) and LayerNorm: what a transformer layer needs."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(FEATURES, 3 * FEATURES)
        self.out = nn.Linear(FEATURES, FEATURES)
        self.norm = nn.LayerNorm(FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, FEATURES // 2).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.norm(x + self.out(a.transpose(1, 2).reshape(b, s, FEATURES)))


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return TinyEncoder().eval()


@pytest.fixture(scope="module")
def compiled(model: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> dict[str, cuvil.CompiledModel]:
    """Exported once (batch in 1..64, sequence a multiple of 8 up to 512), built for ref and native."""
    batch = Dim("batch", min=1, max=64)
    s8 = Dim("s8", min=1, max=64)
    m_ref = cuvil.compile(model, input_spec=[torch.randn(2, 16, FEATURES)],
                          dynamic_shapes={"x": {0: batch, 1: 8 * s8}}, target="ref")
    assert m_ref.graph is not None
    cache = str(tmp_path_factory.mktemp("cuvil-cache"))
    return {"ref": m_ref, "native": cuvil.compile(m_ref.graph, target="native", cache_dir=cache)}


def test_contract_is_reported(compiled: dict[str, cuvil.CompiledModel]) -> None:
    for m in compiled.values():
        (spec,) = m.input_specs
        assert spec.dtype == "f32"
        assert spec.shape == (sym("batch"), 8 * sym("s8"), FEATURES)
        assert m.symbols["batch"].min == 1 and m.symbols["batch"].max == 64
        # the sequence is 8*s8 with s8 in 1..64: 8, 16, ..., 512
        assert m.symbols["s8"].min == 1 and m.symbols["s8"].max == 64


@pytest.mark.slow
@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize(("batch", "seq"), [(1, 8), (7, 8), (64, 8), (1, 64), (7, 64), (1, 512), (7, 512), (64, 512)])
def test_every_valid_shape_matches_eager(compiled: dict[str, cuvil.CompiledModel], model: nn.Module, target: str,
                                         batch: int, seq: int) -> None:
    x = torch.randn(batch, seq, FEATURES, generator=torch.Generator().manual_seed(batch * 1000 + seq))
    with torch.no_grad():
        expected = model(x).numpy()
    (got,) = compiled[target](x.numpy())
    assert got.shape == (batch, seq, FEATURES)
    assert relative_l2(got, expected) < TOL


@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize(("batch", "seq", "message"), [
    (65, 8, "batch=65 is above its maximum 64"),
    (0, 8, "batch=0 is below its minimum 1"),
    (2, 12, "dim 1 is 8*s8, so it must be a multiple of 8, got 12"),
    (2, 520, "s8=65 is above its maximum 64"),
])
def test_invalid_shapes_are_refused(compiled: dict[str, cuvil.CompiledModel], target: str, batch: int, seq: int,
                                    message: str) -> None:
    with pytest.raises(cuvil.InputError) as info:
        compiled[target](np.zeros((batch, seq, FEATURES), np.float32))
    assert message in str(info.value)
    assert "input 'x'" in str(info.value)


def test_tensor_spec_symbols_with_dims(model: nn.Module) -> None:
    """The same contract written as a TensorSpec: ``seq`` is one symbol, a multiple of 8 in 8..512."""
    m = cuvil.compile(model, input_spec=[cuvil.TensorSpec(("batch", "seq", FEATURES), "float32")],
                      dims={"batch": (1, 64), "seq": cuvil.multiple_of(8, min=8, max=512)})
    assert m.input_specs[0].shape == (sym("batch"), sym("seq"), FEATURES)
    assert m.symbols["seq"] == cuvil.api.constraint_info("seq", cuvil.multiple_of(8, min=8, max=512))
    x = torch.randn(3, 24, FEATURES)
    with torch.no_grad():
        expected = model(x).numpy()
    assert relative_l2(m(x)[0].numpy(), expected) < TOL
    with pytest.raises(cuvil.InputError, match="seq=12 is not a multiple of 8"):
        m(torch.zeros(3, 12, FEATURES))


def test_dims_may_narrow_but_not_widen(model: nn.Module) -> None:
    spec: dict[str, Any] = {"x": {0: Dim("batch", min=1, max=64)}}
    m = cuvil.compile(model, input_spec=[torch.randn(2, 8, FEATURES)], dynamic_shapes=spec, dims={"batch": (1, 16)})
    assert m.symbols["batch"].max == 16
    with pytest.raises(cuvil.InputError, match="batch=17 is above its maximum 16"):
        m(np.zeros((17, 8, FEATURES), np.float32))
    with pytest.raises(cuvil.CuvilError, match=r"batch maximum 256 is above the 64 torch\.export allowed"):
        cuvil.compile(model, input_spec=[torch.randn(2, 8, FEATURES)], dynamic_shapes=spec, dims={"batch": (1, 256)})
    with pytest.raises(cuvil.CuvilError, match="no symbolic dim 'seq'"):
        cuvil.compile(model, input_spec=[torch.randn(2, 8, FEATURES)], dynamic_shapes=spec, dims={"seq": (1, 8)})


def test_specialized_example_size_is_explained(model: nn.Module) -> None:
    """An example batch of 1 makes torch.export specialize the dim: torch's explanation reaches the user."""
    with pytest.raises(cuvil.ModelError) as info:
        cuvil.compile(model, input_spec=[torch.randn(1, 8, FEATURES)],
                      dynamic_shapes={"x": {0: Dim("batch", min=2, max=64)}})
    text = str(info.value)
    assert text.startswith("torch.export could not export the model")
    assert "batch" in text
