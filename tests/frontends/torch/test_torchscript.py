"""TorchScript models: scripted and traced modules, their ``torch.jit.save`` files, the two conversion
routes (torch's TorchScript-to-ExportedProgram converter, else its TorchScript ONNX exporter), scripted
control flow, the CLI, and the refusals.

Tolerance: relative L2 error <= 1e-5 against eager PyTorch for float outputs (cuvil.metrics).  The
ResNet-18 and BERT-style cases, and every native build, are slow.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils._pytree as pytree  # noqa: E402
from torch import nn  # noqa: E402

import cuvil  # noqa: E402
from cuvil.cli import main  # noqa: E402
from cuvil.errors import CuvilError, ModelError  # noqa: E402
from cuvil.metrics import relative_l2  # noqa: E402
from tests.support.zoo import families as zoo  # noqa: E402

RTOL_L2 = 1e-5

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")

ZOO: dict[str, Callable[[], zoo.Built]] = {"mlp": zoo.mlp, "resnet18": zoo.resnet18, "bert": zoo.scriptable_bert}
ROUTE_LOGGER = "cuvil.frontends.torch"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-torchscript-cache"))


def to_torchscript(model: nn.Module, args: tuple[Any, ...], kind: str) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.script(model) if kind == "script" else torch.jit.trace(model, args)


def assert_matches_eager(model: Any, args: tuple[Any, ...], compiled: cuvil.CompiledModel) -> None:
    with torch.no_grad():
        want = [t.numpy() for t in pytree.tree_leaves(model(*args))]
    got = compiled(*[a.numpy() for a in args])
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"output {k}"
        if w.dtype.kind == "f":
            err = relative_l2(g, w)
            assert err <= RTOL_L2, f"output {k}: relative L2 error {err:.3g} > {RTOL_L2}"
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")


def compile_quietly(model: Any, target: str = "ref", **kw: Any) -> cuvil.CompiledModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cuvil.compile(model, target, **kw)


# the zoo's MLP, ResNet-18 and BERT-style encoder, scripted and traced, as modules and as files ------------------


def _zoo_params(native: bool) -> list[Any]:
    out = []
    for name in ZOO:
        for kind in ("script", "trace"):
            slow = native or name != "mlp"
            out.append(pytest.param(name, kind, id=f"{name}-{kind}", marks=[pytest.mark.slow] if slow else []))
    return out


def _check_zoo(name: str, kind: str, target: str, tmp_path: Path, cache_dir: str) -> None:
    model, args = ZOO[name]()
    ts = to_torchscript(model, args, kind)
    m = compile_quietly(ts, target, input_spec=list(args), cache_dir=cache_dir)
    assert m.info.source_kind == "torchscript module"
    assert_matches_eager(model, args, m)
    path = tmp_path / f"{name}-{kind}.pt"
    torch.jit.save(ts, str(path))
    from_file = compile_quietly(path, target, input_spec=list(args), cache_dir=cache_dir)
    assert from_file.info.source_kind == "torchscript file"
    assert from_file.input_names == m.input_names and from_file.output_names == m.output_names
    assert_matches_eager(model, args, from_file)


@pytest.mark.parametrize(("name", "kind"), _zoo_params(native=False))
def test_zoo_torchscript_matches_eager_ref(name: str, kind: str, tmp_path: Path, cache_dir: str) -> None:
    _check_zoo(name, kind, "ref", tmp_path, cache_dir)


@pytest.mark.parametrize(("name", "kind"), _zoo_params(native=True))
def test_zoo_torchscript_matches_eager_native(name: str, kind: str, tmp_path: Path, cache_dir: str) -> None:
    _check_zoo(name, kind, "native", tmp_path, cache_dir)


# routes, names and dynamic dims ------------------------------------------------------------------------------


def test_scripted_module_takes_the_exported_program_route(caplog: pytest.LogCaptureFixture) -> None:
    model, _ = zoo.mlp()
    with caplog.at_level(logging.INFO, logger=ROUTE_LOGGER):
        m = compile_quietly(torch.jit.script(model), input_spec=[cuvil.TensorSpec(("batch", 3, 16))])
    routes = [r.getMessage() for r in caplog.records if "TorchScript model" in r.getMessage()]
    assert any("TorchScript-to-ExportedProgram converter" in r for r in routes), routes
    assert not any("ONNX" in r for r in routes), routes
    # the forward's argument name, the symbol the spec named, and any batch size
    assert m.input_names == ["input"] and m.output_names == ["output"]
    assert [str(d) for d in m.input_specs[0].shape] == ["batch", "3", "16"]
    for batch in (2, 5):
        x = torch.randn(batch, 3, 16, generator=torch.Generator().manual_seed(batch))
        assert_matches_eager(model, (x,), m)


class BatchLoop(nn.Module):
    """A scripted loop whose trip count is the batch size: torch's TorchScript-to-ExportedProgram
    converter refuses prim::Loop, so the model goes through the ONNX exporter (a Loop node)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(x.size(0)):
            y = torch.tanh(self.lin(y))
        return y


def test_scripted_loop_falls_back_to_the_onnx_exporter(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = BatchLoop().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.INFO, logger=ROUTE_LOGGER):
        m = compile_quietly(torch.jit.script(model), input_spec=[x])
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "TorchScript-to-ExportedProgram route failed" in text and "prim::Loop" in text, text
    assert "converted through torch's TorchScript ONNX exporter" in text, text
    assert m.input_names == ["x"] and m.output_names == ["output"]
    assert m.graph is not None and any(n.op == "loop" for n in m.graph.walk())
    assert_matches_eager(model, (x,), m)


def test_scripted_loop_with_a_symbolic_batch_through_onnx() -> None:
    torch.manual_seed(0)
    model = BatchLoop().eval()
    m = compile_quietly(torch.jit.script(model), input_spec=[cuvil.TensorSpec(("batch", 8))])
    assert [str(d) for d in m.input_specs[0].shape] == ["batch", "8"]
    for batch in (2, 4):
        assert_matches_eager(model, (torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch)),), m)


class SqueezeLead(nn.Module):
    """``if x.dim() == 3: x = x.squeeze(0)``: the branch is decided by the input's rank."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:
            x = x.squeeze(0)
        return self.lin(x)


@pytest.mark.parametrize("shape", [(1, "seq", 8), ("seq", 8)], ids=["rank3", "rank2"])
def test_rank_decided_branch_is_specialised(shape: tuple[Any, ...]) -> None:
    torch.manual_seed(0)
    model = SqueezeLead().eval()
    ts = torch.jit.script(model)
    m = compile_quietly(ts, input_spec=[cuvil.TensorSpec(shape)])
    assert m.output_specs[0].type.rank == 2
    for seq in (3, 6):
        x = torch.randn(*[seq if d == "seq" else d for d in shape], generator=torch.Generator().manual_seed(seq))
        assert_matches_eager(ts, (x,), m)


class SqueezeMiddleLoop(nn.Module):
    """Branches of different ranks decided by a static dim of an input whose batch is symbolic, and a
    loop over the batch (so the ONNX exporter converts it, writing the branch as an If on the shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3 and x.size(1) == 1:
            x = x.squeeze(1)
        y = x
        for _ in range(x.size(0)):
            y = torch.tanh(self.lin(y))
        return y


def test_shape_decided_if_through_onnx_folds() -> None:
    """The exporter writes ``If(Shape(x)[1] == 1)`` with a rank-2 and a rank-3 branch; dim 1 is 1 by the
    input's type, so the import takes the then-branch."""
    torch.manual_seed(0)
    model = SqueezeMiddleLoop().eval()
    m = compile_quietly(torch.jit.script(model), input_spec=[cuvil.TensorSpec(("batch", 1, 8))])
    assert m.output_specs[0].type.rank == 2
    for batch in (2, 3):
        assert_matches_eager(model, (torch.randn(batch, 1, 8, generator=torch.Generator().manual_seed(batch)),), m)


def test_script_function() -> None:
    fn = torch.jit.script(_scaled_tanh)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    m = compile_quietly(fn, input_spec=[x])
    assert m.input_names == ["x"]
    assert_matches_eager(fn, (x,), m)


def _scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 0.5) + x.sum(-1, keepdim=True)


# refusals ---------------------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_file_written_by_torch_save_is_refused(tmp_path: Path) -> None:
    model, args = zoo.mlp()
    path = tmp_path / "pickled.pt"
    torch.save(model, str(path))
    with pytest.raises(ModelError, match=r"written by torch\.save") as info:
        cuvil.compile(path, input_spec=list(args))
    assert str(path) in _one_line(info.value)
    state = tmp_path / "weights.pth"
    torch.save(model.state_dict(), str(state))
    with pytest.raises(ModelError, match=r"not torch\.jit\.save"):
        cuvil.compile(str(state), input_spec=list(args))


def test_pt_file_that_is_not_an_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a model at all")
    with pytest.raises(ModelError, match="not a TorchScript archive") as info:
        cuvil.compile(path, input_spec=[torch.zeros(2)])
    _one_line(info.value)


def test_torchscript_needs_a_positional_input_spec(tmp_path: Path) -> None:
    model, args = zoo.mlp()
    ts = torch.jit.script(model)
    with pytest.raises(CuvilError, match="needs input_spec"):
        cuvil.compile(ts)
    with pytest.raises(CuvilError, match="by position"):
        cuvil.compile(ts, input_spec={"input": args[0]})


class FixedRows(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(3, 4) * 2.0


def test_dim_the_model_fixes_is_refused_not_exported_to_onnx(caplog: pytest.LogCaptureFixture) -> None:
    """The ONNX exporter would take the dynamic batch and give a model that fails for other sizes."""
    ts = torch.jit.script(FixedRows().eval())
    with caplog.at_level(logging.INFO, logger=ROUTE_LOGGER), pytest.raises(ModelError, match="Constraints violated"):
        compile_quietly(ts, input_spec=[torch.ones(3, 4)], dynamic_shapes=({0: torch.export.Dim("b")},))
    assert not any("ONNX" in r.getMessage() for r in caplog.records)


def test_training_mode_torchscript_is_refused() -> None:
    model, args = zoo.mlp()
    ts = torch.jit.script(model.train())
    with pytest.raises(ModelError, match="training mode"):
        cuvil.compile(ts, input_spec=list(args))


# the command line ------------------------------------------------------------------------------------------


def test_cli_compiles_a_torchscript_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = zoo.mlp()
    path = tmp_path / "mlp.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    assert main(["compile", str(path), "--input-spec", "batch,3,16", "--dim", "batch=1:64", "-t", "ref"]) == 0
    out = capsys.readouterr().out
    assert "input  input: f32[batch, 3, 16]" in out and "output output: f32[batch, 10]" in out, out
    assert "symbol batch: 1..64" in out, out
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    np.savez(tmp_path / "x.npz", input=x)
    args = ["run", str(path), "--input-spec", "2,3,16", "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]
    assert main(args) == 0
    assert "output: float32[2, 10]" in capsys.readouterr().out
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    with np.load(tmp_path / "y.npz") as saved:
        assert relative_l2(saved["output"], want) <= RTOL_L2


def test_cli_refuses_a_non_torchscript_pt_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = zoo.mlp()
    path = tmp_path / "pickled.pt"
    torch.save(model.state_dict(), str(path))
    assert main(["compile", str(path), "--input-spec", "2,3,16", "-t", "ref"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cuvil: error:") and "torch.save" in err and "\n" not in err, err


def test_cli_input_spec_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(tmp_path / "m.pt"), "--input-spec", "2,,3", "-t", "ref"]) == 2
    assert "--input-spec" not in (err := capsys.readouterr().err) and "a dim is empty" in err, err
    assert main(["compile", str(tmp_path / "m.pt"), "--input-spec", "2,3:complex7", "-t", "ref"]) == 2
    assert "unknown element type" in capsys.readouterr().err
