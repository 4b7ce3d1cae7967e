"""nn.LSTM, nn.GRU and nn.RNN through the PyTorch front end (cuvil/frontends/torch/recurrent.py,
aten/rnn.py) against eager PyTorch: a dynamic sequence length (one compiled model, two lengths),
several layers, both directions, batch_first, initial states, unbatched input, aten's ops in a
program exported elsewhere; the module is left as it was; and the refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import cuvil
from cuvil.errors import CuvilError
from cuvil.ir.symbolic import sym

# every test exports a model with torch.export (seconds each): the slow tier
pytestmark = pytest.mark.slow

ATOL = RTOL = 1e-5
LENGTHS = (5, 31)


class Recurrent(nn.Module):
    """A two-layer bidirectional batch-first LSTM with initial states, a two-layer bidirectional GRU over its
    output (time-major), and a ReLU RNN: every result of each."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(16, 6, num_layers=2, bidirectional=True)
        self.rnn = nn.RNN(4, 5, nonlinearity="relu", batch_first=True)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, (h, c) = self.lstm(x, (h0, c0))
        g, gh = self.gru(y.transpose(0, 1))
        r, rh = self.rnn(x)
        return y, h, c, g, gh, r, rh


def _inputs(steps: int, batch: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(steps)
    return [torch.randn(batch, steps, 4, generator=g), torch.randn(4, batch, 8, generator=g),
            torch.randn(4, batch, 8, generator=g)]


def _assert_matches_eager(model: nn.Module, m: cuvil.CompiledModel, inputs: list[torch.Tensor]) -> None:
    with torch.no_grad():
        want = model(*inputs)
    got = m(*[t.numpy() for t in inputs])
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == tuple(w.shape), (k, g.shape, w.shape)
        np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL, err_msg=f"result {k}")


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return Recurrent().eval()


@pytest.fixture(scope="module")
def compiled(model: nn.Module) -> cuvil.CompiledModel:
    steps, batch = Dim("steps", min=2, max=4096), Dim("batch", min=2, max=64)
    return cuvil.compile(model, "ref", input_spec=_inputs(7),
                         dynamic_shapes=({0: batch, 1: steps}, {1: batch}, {1: batch}))


def test_dynamic_sequence_length_matches_eager(model: nn.Module, compiled: cuvil.CompiledModel) -> None:
    graph = compiled.graph
    assert graph is not None
    # one loop per layer and direction: 2 x 2 (LSTM) + 2 x 2 (GRU) + 1 (RNN)
    assert sum(n.op == "loop" for n in graph.walk()) == 9
    assert graph.outputs[0].type.shape == (sym("batch"), sym("steps"), 16)
    for steps in LENGTHS:
        _assert_matches_eager(model, compiled, _inputs(steps, batch=3))


def test_exporting_leaves_the_modules_as_they_were(model: nn.Module, compiled: cuvil.CompiledModel) -> None:
    for m in (model.lstm, model.gru, model.rnn):
        assert "forward" not in vars(m)
    out = model(*_inputs(6))  # torch's own forward, with autograd
    assert out[0].grad_fn is not None


@pytest.mark.slow
def test_dynamic_sequence_length_natively(model: nn.Module, compiled: cuvil.CompiledModel, tmp_path: Any) -> None:
    assert compiled.graph is not None
    m = cuvil.compile(compiled.graph, "native", cache_dir=str(tmp_path))
    for steps in LENGTHS:
        _assert_matches_eager(model, m, _inputs(steps, batch=3))


def test_unbatched_input_without_initial_state() -> None:
    torch.manual_seed(1)
    model = nn.GRU(3, 4, bidirectional=True).eval()
    m = cuvil.compile(model, "ref", input_spec=[torch.randn(6, 3)], dynamic_shapes=({0: Dim("steps", max=512)},))
    for steps in LENGTHS:
        x = torch.randn(steps, 3)
        with torch.no_grad():
            want = model(x)
        for g, w in zip(m(x.numpy()), want):
            np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("steps", [6, 20])
def test_aten_lstm_of_a_program_exported_elsewhere(steps: int) -> None:
    """torch.export's own aten.lstm.input (static length): unrolled when short, a loop when long."""
    torch.manual_seed(2)
    model = nn.LSTM(4, 5, num_layers=2, bidirectional=True).eval()
    x = torch.randn(steps, 2, 4)
    program = torch.export.export(model, (x,), strict=False)
    assert any(str(n.target) == "aten.lstm.input" for n in program.graph.nodes)
    m = cuvil.compile(program, "ref")
    assert m.graph is not None
    assert sum(n.op == "loop" for n in m.graph.walk()) == (0 if steps <= 16 else 4)
    with torch.no_grad():
        y, (h, c) = model(x)
    for g, w in zip(m(x.numpy()), (y, h, c)):
        np.testing.assert_allclose(g, w.numpy(), rtol=RTOL, atol=ATOL)


def test_lstm_projections_are_refused_by_name() -> None:
    model = nn.LSTM(4, 6, proj_size=3).eval()
    with pytest.raises(CuvilError, match="proj_size"):
        cuvil.compile(model, "ref", input_spec=[torch.randn(5, 2, 4)])
