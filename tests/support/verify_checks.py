"""Checks defined for the verification runner's tests (not the real ones: those live in cuvil/verify/checks and
are tested on their own), registered only while a test asks for them (the test_checks fixture of
tests/verify/conftest.py), and the small MLP those tests verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from cuvil.metrics import relative_l2
from cuvil.verify.base import Check, CheckResult, Status


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
