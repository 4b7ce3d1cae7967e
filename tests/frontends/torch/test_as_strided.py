"""``aten.as_strided`` in the PyTorch front end: each view form against eager PyTorch, the ops each
form becomes, the refusals (with the node's source line), and the adaptive pooling that leaves an
as_strided in exported graphs (a transformers Swin's pooler).

Tolerance: exact equality for pure data movement; relative L2 error <= 1e-5 where the model computes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import cuvil  # noqa: E402
from cuvil.errors import UnsupportedOpError  # noqa: E402
from cuvil.frontends.torch import load_torch  # noqa: E402
from cuvil.metrics import relative_l2  # noqa: E402

RTOL_L2 = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

View = Callable[[Any], Any]

# name -> (input shape, the view, ops the mapping must use, ops it must not use)
FORMS: dict[str, tuple[tuple[int, ...], View, set[str], set[str]]] = {
    "identity": ((4, 6), lambda x: x.as_strided((4, 6), (6, 1)), set(), {"gather", "slice", "transpose"}),
    "contiguous_block": ((4, 6), lambda x: x.as_strided((2, 6), (6, 1), 6), {"slice"}, {"gather"}),
    "block_with_steps": ((4, 6), lambda x: x.as_strided((2, 3), (12, 2), 1), {"slice"}, {"gather"}),
    "block_past_the_end": ((4, 6), lambda x: x.as_strided((2, 2), (12, 1), 10), {"slice", "pad"}, {"gather"}),
    "transpose": ((4, 6), lambda x: x.as_strided((6, 4), (1, 6)), {"transpose"}, {"gather"}),
    "permute": ((2, 3, 4), lambda x: x.as_strided((4, 2, 3), (1, 12, 4)), {"transpose"}, {"gather"}),
    "expand": ((4, 6), lambda x: x.as_strided((3, 4, 6), (0, 6, 1)), {"expand"}, {"gather"}),
    "size_one_dims": ((4, 6), lambda x: x.as_strided((1, 4, 1, 6), (99, 6, 7, 1)), set(), {"gather"}),
    "element": ((4, 6), lambda x: x.as_strided((), (), 5), {"slice"}, {"gather"}),
    "windows": ((10,), lambda x: x.as_strided((4, 3), (2, 1)), {"gather"}, set()),
    "tiles": ((6, 6), lambda x: x.as_strided((2, 2, 3, 3), (18, 3, 6, 1)), {"transpose"}, {"gather"}),
    "windows_2d": ((6, 6), lambda x: x.as_strided((2, 2, 3, 3), (12, 2, 6, 1)), {"gather"}, set()),
    "windows_expanded": ((10,), lambda x: x.as_strided((2, 4, 3), (0, 2, 1)), {"gather", "expand"}, set()),
    "strides_not_nested": ((10,), lambda x: x.as_strided((2, 2), (5, 2)), {"gather"}, set()),
    "of_a_transposed_input": ((4, 6), lambda x: x.t().as_strided((3, 4), (1, 6), 2), {"transpose"}, {"gather"}),
    "empty": ((4, 6), lambda x: x.as_strided((0, 3), (6, 1)), set(), {"gather"}),
}


class Strided(nn.Module):
    """The view of ``x + 0`` (so the view's input is a value the graph computes, as in real models)."""

    def __init__(self, view: View) -> None:
        super().__init__()
        self.view = view

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.view(x + 0)  # type: ignore[no-any-return]


def _compile(model: nn.Module, args: tuple[Any, ...], target: str = "ref", **kw: Any) -> cuvil.CompiledModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cuvil.compile(model, target, input_spec=list(args), **kw)


def _input(shape: tuple[int, ...]) -> Any:
    return torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape) * 0.5 - 3.0


@pytest.mark.parametrize("name", list(FORMS))
def test_as_strided_form_matches_eager(name: str) -> None:
    shape, view, uses, avoids = FORMS[name]
    model = Strided(view).eval()
    x = _input(shape)
    m = _compile(model, (x,))
    want = model(x).numpy()
    got = np.asarray(m(x.numpy())[0])
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    np.testing.assert_array_equal(got, want)
    assert m.graph is not None
    ops = {n.op for n in m.graph.walk()}
    assert uses <= ops and not (avoids & ops), sorted(ops)


class EveryForm(nn.Module):
    """Every form on one input, for a single native build."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> tuple[Any, ...]:
        out = []
        for shape, view, _, _ in FORMS.values():
            src = {(4, 6): a, (2, 3, 4): b, (10,): c, (6, 6): d}[shape]
            out.append(view(src + 0))
        return tuple(out)


@pytest.mark.slow
def test_every_as_strided_form_native() -> None:
    model = EveryForm().eval()
    args = (_input((4, 6)), _input((2, 3, 4)), _input((10,)), _input((6, 6)))
    m = _compile(model, args, "native")
    want = [t.numpy() for t in model(*args)]
    got = m(*[t.numpy() for t in args])
    for name, g, w in zip(FORMS, got, want):
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=name)


# refusals: the node and the line of this file that made it --------------------------------------------------


class SymbolicView(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 0).as_strided((x.shape[0], 3), (6, 2))  # the line the refusal names


class ViewOfASlice(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 0)[:, :3].as_strided((2, 4), (6, 1), 1)  # reads elements outside the slice


def _line_of(fragment: str) -> int:
    from pathlib import Path

    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if fragment in line)


def test_symbolic_as_strided_is_refused_with_its_source_line() -> None:
    spec = [cuvil.TensorSpec(("batch", 6))]
    with pytest.raises(UnsupportedOpError, match="symbolic sizes, strides") as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cuvil.compile(SymbolicView().eval(), input_spec=spec)
    assert f"test_as_strided.py:{_line_of('the line the refusal names')}" in str(info.value)


def test_as_strided_of_a_view_is_refused_with_its_source_line() -> None:
    model = ViewOfASlice().eval()
    x = _input((4, 6))
    model(x)  # eager takes it: the view reads the parent's storage
    with pytest.raises(UnsupportedOpError, match="view of a larger storage") as info:
        _compile(model, (x,))
    assert f"test_as_strided.py:{_line_of('reads elements outside the slice')}" in str(info.value)


# adaptive pooling ----------------------------------------------------------------------------------------------


class TransposedPooler(nn.Module):
    """A Swin-style head: tokens [b, t, c] transposed to [b, c, t] and pooled by ``AdaptiveAvgPool1d(1)``;
    the pooling's decomposition keeps the transposed layout with an as_strided."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(8, 8)
        self.pool = nn.AdaptiveAvgPool1d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.pool(self.proj(x).transpose(1, 2)), 1)


def test_adaptive_pooling_of_a_transposed_input_matches_eager() -> None:
    model = TransposedPooler().eval()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = load_torch(model, [x])
    assert "aten.as_strided.default" in {mp.aten for mp in imported.mappings}
    m = _compile(model, (x,))
    with torch.no_grad():
        want = model(x).numpy()
    assert relative_l2(np.asarray(m(x.numpy())[0]), want) <= RTOL_L2


@pytest.mark.slow
@pytest.mark.parametrize("target", ["ref", "native"])
def test_tiny_swin_matches_eager(target: str) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1],
                                     num_heads=[2, 2], window_size=4)
    model = transformers.SwinModel(config).eval()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    m = _compile(model, (x,), target)
    # a ModelOutput, which pytree flattens without key paths: its outputs keep the fields' names
    assert m.output_names == ["last_hidden_state", "pooler_output"]
    with torch.no_grad():
        want = [t.numpy() for t in model(x).to_tuple()]
    got = m(x.numpy())
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert relative_l2(np.asarray(g), w) <= RTOL_L2
