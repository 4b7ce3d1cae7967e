"""The verification runner: selection, targets, crashes, strictness, progress, configuration.

The checks used here are defined in this file (the real ones live in cuvil/verify/checks and
are tested on their own); they are registered only for the test that uses them.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from cuvil.metrics import relative_l2
from cuvil.verify import base, verify
from cuvil.verify.base import Check, CheckResult, Status, VerifyError
from cuvil.verify.config import find_config, load_config, parse_config
from cuvil.verify.runner import Progress, load_builtin_checks, resolve_targets, select_checks


class AgreesWithReference(Check):
    """Each target's outputs against the float64 reference; threshold ``rel_l2`` (default 1e-5)."""

    name = "t-agree"
    group = "test-numerics"

    def run(self, ctx: Any) -> list[CheckResult]:
        limit = float(self.option("rel_l2", 1e-5))
        inputs = ctx.inputs()
        want = ctx.reference(inputs, float64=True)
        out = []
        for t in ctx.targets:
            m = ctx.compiled(t)
            got = m(*inputs)
            errs = {n: relative_l2(g, w) for n, g, w in zip(m.output_names, got, want)}
            worst = max(errs, key=lambda n: errs[n])
            ok = errs[worst] <= limit
            out.append(CheckResult(
                self.name, Status.PASS if ok else Status.FAIL,
                f"largest relative L2 {errs[worst]:.3g} on {worst} (limit {limit:g})", target=t,
                figures={"max_rel_l2": errs[worst]}, where={} if ok else {"output": worst},
                details={"series": {"title": "error per output", "series": [
                    {"name": t, "y": [errs[n] for n in m.output_names]}]}},
                tensors={} if ok else {f"{worst}.got": got[0], f"{worst}.want": want[0]}))
        return out


class Crashes(Check):
    name = "t-crash"
    group = "test-misc"

    def run(self, ctx: Any) -> list[CheckResult]:
        last = ctx.targets[len(ctx.targets)]  # a bug: one past the end
        return [CheckResult(self.name, Status.PASS, f"{last} is fine")]


class Warns(Check):
    name = "t-warn"
    group = "test-misc"

    def run(self, ctx: Any) -> list[CheckResult]:
        return [CheckResult(self.name, Status.WARN, "symbol batch is unbounded", where={"symbol": "batch"},
                            details={"suggestion": "batch=1:64"})]


class Figures(Check):
    """Fixed figures read from the options, to exercise baselines: ``figures = {name: value}``."""

    name = "t-figures"
    group = "test-misc"

    def run(self, ctx: Any) -> list[CheckResult]:
        figs = {k: float(v) for k, v in self.option("figures", {"median_ms": 1.0}).items()}
        return [CheckResult(self.name, Status.PASS, "figures", target=t, figures=dict(figs)) for t in ctx.targets]


class ReturnsNothing(Check):
    name = "t-empty"
    group = "test-misc"

    def run(self, ctx: Any) -> list[CheckResult]:
        return []


TEST_CHECKS: tuple[type[Check], ...] = (AgreesWithReference, Crashes, Warns, Figures, ReturnsNothing)


@pytest.fixture
def test_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only this file's checks are registered while a test runs (the real ones are loaded first,
    so they register into the real registry, which comes back afterwards)."""
    load_builtin_checks()
    monkeypatch.setattr(base, "_CHECKS", {c.name: c for c in TEST_CHECKS})
    yield


def write_mlp(path: Path, *, unsupported: bool = False) -> Path:
    """y = relu(x @ W + b) for x: f32[batch, 8]; ``unsupported`` adds an op Cuvil cannot import."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [8, 4], rng.standard_normal((8, 4)).astype(np.float32).ravel())
    b = helper.make_tensor("b", TensorProto.FLOAT, [4], rng.standard_normal(4).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["y"], name="relu")]
    if unsupported:
        nodes.append(helper.make_node("Frobnicate", ["y"], ["z"], name="frob", domain="com.example"))
    out = "z" if unsupported else "y"
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", 4])], initializer=[w, b])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.example", 1)] if unsupported else [])
    onnx.save(helper.make_model(g, opset_imports=opsets), str(path))
    return path


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return write_mlp(tmp_path / "mlp.onnx")


# ---- selection and targets ---------------------------------------------------------------------------------------


def test_select_by_name_group_and_prefix(test_checks: None) -> None:
    assert [c.name for c in select_checks(["t-warn", "t-agree"])] == ["t-warn", "t-agree"]
    assert {c.name for c in select_checks(["test-misc"])} == {"t-crash", "t-warn", "t-figures", "t-empty"}
    assert [c.name for c in select_checks(["test-num"])] == ["t-agree"]  # a unique group prefix
    assert len(select_checks(None)) == len(TEST_CHECKS)
    with pytest.raises(VerifyError, match="ambiguous check or group 'test'"):
        select_checks(["test"])
    with pytest.raises(VerifyError, match="unknown check or group 'nope'"):
        select_checks(["nope"])


def test_targets_default_all_and_unknown() -> None:
    run, skipped = resolve_targets(None)
    assert run == ["ref", "native"] and not skipped
    run, _ = resolve_targets(["all"])
    assert run[0] == "ref" and "native" in run and "generic" in run
    with pytest.raises(VerifyError, match="unknown target 'tpu'"):
        resolve_targets(["ref", "tpu"])


def test_unavailable_target_is_reported_as_skipped(test_checks: None, mlp: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from cuvil.verify import runner

    real = runner.target_unavailable
    monkeypatch.setattr(runner, "target_unavailable", lambda t: "no wasm here" if t == "wasm32" else real(t))
    report = verify(str(mlp), checks=["t-agree"], targets=["ref", "wasm32"], config={})
    (skip,) = report.get("t-agree", "wasm32")
    assert skip.status is Status.SKIP and "no wasm here" in skip.summary
    assert report.get("t-agree", "ref")[0].status is Status.PASS
    assert report.exit_status == 0


# ---- running -----------------------------------------------------------------------------------------------------


def test_passing_check_on_ref_and_native(test_checks: None, mlp: Path, tmp_path: Path) -> None:
    report = verify(str(mlp), checks="t-agree", targets=["ref", "native"], config={},
                          cache_dir=tmp_path / "cache")
    assert [(r.target, r.status) for r in report] == [("ref", Status.PASS), ("native", Status.PASS)]
    assert 0 < report.get("t-agree", "native")[0].figures["max_rel_l2"] < 1e-5
    assert report.exit_status == 0 and report.verdict.startswith("PASS: 2 pass")


def test_threshold_from_config_makes_it_fail(test_checks: None, mlp: Path, tmp_path: Path) -> None:
    (tmp_path / "cuvil.toml").write_text("[checks.t-agree]\nrel_l2 = 1e-30\n")
    report = verify(str(mlp), checks=["t-agree"], targets=["native"], config=tmp_path / "cuvil.toml",
                          cache_dir=tmp_path / "cache")
    (r,) = report.results
    assert r.status is Status.FAIL and r.where == {"output": "y"}
    assert report.exit_status == 1 and report.failed == [r]


def test_a_crashing_check_is_an_error_result_and_the_suite_goes_on(test_checks: None, mlp: Path) -> None:
    report = verify(str(mlp), checks=["t-crash", "t-empty", "t-warn"], targets=["ref"], config={})
    crash, empty, warn = report.results
    assert crash.status is Status.FAIL and crash.details["error"]["type"] == "IndexError"
    assert "IndexError" in crash.summary and "Traceback" in crash.details["error"]["traceback"]
    assert empty.status is Status.FAIL and "no result" in empty.summary
    assert warn.status is Status.WARN
    assert report.exit_status == 1


def test_warnings_fail_only_when_strict(test_checks: None, mlp: Path, tmp_path: Path) -> None:
    assert verify(str(mlp), checks=["t-warn"], config={}).exit_status == 0
    assert verify(str(mlp), checks=["t-warn"], config={}, strict=True).exit_status == 1
    (tmp_path / "cuvil.toml").write_text("strict = true\n")
    assert verify(str(mlp), checks=["t-warn"], config=tmp_path / "cuvil.toml").exit_status == 1
    assert verify(str(mlp), checks=["t-warn"], config=tmp_path / "cuvil.toml", strict=False).exit_status == 0


def test_config_selects_checks_and_targets(test_checks: None, mlp: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.cuvil.verify]\n'
                                            'select = ["t-warn", "t-figures"]\ntargets = ["ref"]\n')
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)  # found from a folder below the project root
    report = verify(str(mlp))
    assert report.checks == ["t-warn", "t-figures"] and report.targets == ["ref"]
    assert report.config_path == str(tmp_path / "pyproject.toml")


def test_config_errors_are_usage_errors(tmp_path: Path, test_checks: None, mlp: Path) -> None:
    bad = tmp_path / "cuvil.toml"
    bad.write_text("selct = ['coverage']\n")
    with pytest.raises(VerifyError, match="unknown keys \\['selct'\\]"):
        load_config(bad)
    bad.write_text("strict = 'yes'\n")
    with pytest.raises(VerifyError, match="strict must be true or false"):
        load_config(bad)
    bad.write_text("[checks\n")
    with pytest.raises(VerifyError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(VerifyError, match="unknown checks: t-agre"):
        verify(str(mlp), checks=["t-warn"], config={"checks": {"t-agre": {"rel_l2": 1}}})
    bad.unlink()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(VerifyError, match=r"no \[tool\.cuvil\.verify\] table"):
        load_config(tmp_path / "pyproject.toml")
    assert find_config(tmp_path).select is None  # a pyproject without the table: defaults


def test_baseline_margins_parse() -> None:
    cfg = parse_config({"baseline": {"relative": 0.2, "figures": {"latency.*": 0.5, "x.*": {"absolute": 1e-6}}}})
    assert cfg.baseline.default.relative == 0.2
    assert dict(cfg.baseline.figures)["latency.*"].relative == 0.5
    assert dict(cfg.baseline.figures)["x.*"].absolute == 1e-6 and dict(cfg.baseline.figures)["x.*"].relative == 0.2


def test_model_arguments(tmp_path: Path, test_checks: None) -> None:
    from cuvil.verify.loader import load_model

    with pytest.raises(VerifyError, match="no such file"):
        load_model(str(tmp_path / "missing.onnx"))
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(VerifyError):
        load_model(str(tmp_path / "junk.onnx"))
    (tmp_path / "f.py").write_text("def make():\n    return 42\n")
    with pytest.raises(VerifyError, match="must return \\(module, input_spec\\)"):
        load_model(f"{tmp_path / 'f.py'}:make")
    with pytest.raises(VerifyError, match="has no function 'other'"):
        load_model(f"{tmp_path / 'f.py'}:other")
    with pytest.raises(VerifyError, match="cannot verify a int"):
        load_model(3)


def test_torch_factory(tmp_path: Path, test_checks: None) -> None:
    pytest.importorskip("torch")
    (tmp_path / "net.py").write_text(
        "import torch\n\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.Tanh()).eval()\n"
        "    return m, [torch.randn(2, 6)]\n")
    report = verify(f"{tmp_path / 'net.py'}:make", checks=["t-agree"], targets=["ref"], config={})
    (r,) = report.results
    assert r.status is Status.PASS, r.summary
    assert report.model.endswith("net.py:make")


# ---- progress ----------------------------------------------------------------------------------------------------


def test_progress_plain_lines_and_bar(test_checks: None, mlp: Path) -> None:
    plain = io.StringIO()
    verify(str(mlp), checks=["t-warn", "t-figures"], config={}, targets=["ref"],
                 progress=Progress(plain, tty=False))
    lines = plain.getvalue().splitlines()
    assert lines[0] == "[1/2] t-warn on ref ..."
    assert lines[1].startswith("  WARN t-warn: symbol batch is unbounded")
    assert lines[2] == "[2/2] t-figures on ref ..."
    assert lines[-1].startswith("PASS: 1 pass, 1 warn")
    bar = io.StringIO()
    verify(str(mlp), checks=["t-warn", "t-figures"], config={}, targets=["ref"], progress=Progress(bar, tty=True))
    text = bar.getvalue()
    assert "\r" in text and "[" + "#" * 12 + "." * 12 + "] 1/2 t-figures on ref" in text


def test_cuvil_verify_is_the_callable_package(test_checks: None, mlp: Path) -> None:
    import sys

    import cuvil

    assert cuvil.verify is sys.modules["cuvil.verify"] and cuvil.verify.verify is verify
    report = cuvil.verify(str(mlp), checks=["t-warn"], targets=["ref"], config={})  # type: ignore[operator]
    assert report.exit_status == 0 and report.results[0].where == {"symbol": "batch"}
