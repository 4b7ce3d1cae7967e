"""Running the ONNX node conformance cases against a Cuvil target.

Outputs are compared the way ONNX's backend test runner compares them: same
number of outputs, same shape and dtype, and ``assert_allclose`` with
``rtol=1e-3, atol=1e-7`` (NaN equal to NaN); bfloat16 is compared in float32
with ``rtol >= 2**-6``.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cuvil.errors import CuvilError, UnsupportedOpError

# The ops of Cuvil's core op list: a case whose every op is here is "in scope".
CORE_OPS = frozenset(
    [
        "Abs", "Acos", "Acosh", "Add", "AffineGrid", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
        "AveragePool",
        "BatchNormalization", "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor", "BlackmanWindow",
        "Cast", "CastLike", "Ceil", "Celu", "CenterCropPad", "Clip", "Col2Im", "Compress", "Concat", "Constant",
        "ConstantOfShape", "Conv", "ConvTranspose", "Cos", "Cosh", "CumProd", "CumSum",
        "DFT", "DeformConv", "DepthToSpace", "Det", "Div", "Dropout",
        "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike",
        "Flatten", "Floor",
        "Gather", "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool",
        "Greater", "GreaterOrEqual", "GridSample", "GroupNormalization",
        "HammingWindow", "HannWindow", "HardSigmoid", "HardSwish", "Hardmax",
        "Identity", "If", "InstanceNormalization", "IsInf", "IsNaN",
        "LRN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax", "Loop",
        "LpNormalization", "LpPool",
        "MatMul", "Max", "MaxPool", "MaxRoiPool", "MaxUnpool", "Mean", "MeanVarianceNormalization", "Min", "Mish",
        "Mod", "Mul",
        "Neg", "NonMaxSuppression", "NonZero", "Not",
        "OneHot", "Or",
        "PRelu", "Pad", "Pow",
        "RMSNormalization", "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ReduceMax",
        "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize",
        "ReverseSequence", "RoiAlign", "Round",
        "STFT", "Scan", "ScatterElements", "ScatterND", "Selu", "Shape", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh",
        "Size", "Slice", "Softmax", "Softplus", "Softsign", "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
        "SwiGLU", "Swish",
        "Tan", "Tanh", "TensorScatter", "ThresholdedRelu", "Tile", "TopK", "Transpose", "Trilu",
        "Unique", "Unsqueeze", "Upsample",
        "Where",
        "Xor",
    ]
)

RTOL, ATOL = 1e-3, 1e-7


@dataclass
class CaseResult:
    name: str
    status: str  # pass | fail | unsupported | error
    ops: list[str]
    in_scope: bool
    message: str = ""
    seconds: float = 0.0


@dataclass
class Summary:
    target: str
    results: list[CaseResult] = field(default_factory=list)

    def counts(self, scope_only: bool = False) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "unsupported": 0, "error": 0}
        for r in self.results:
            if scope_only and not r.in_scope:
                continue
            out[r.status] += 1
        return out

    def per_op(self, scope_only: bool = False) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for r in self.results:
            if scope_only and not r.in_scope:
                continue
            for op_type in sorted(set(r.ops)):
                row = table.setdefault(op_type, {"pass": 0, "fail": 0, "unsupported": 0, "error": 0})
                row[r.status] += 1
        return dict(sorted(table.items()))

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "counts": self.counts(),
            "core_scope_counts": self.counts(scope_only=True),
            "cases": [asdict(r) for r in self.results],
        }


def _excluded_types(model: object) -> bool:
    import onnx

    assert isinstance(model, onnx.ModelProto)
    # Element types outside the core scope.  The low-bit types Cuvil stores (int4, uint4, int2, uint2,
    # the float8 formats, float4) are in it: a core op's case on them (Cast, CastLike) counts.
    bad = {onnx.TensorProto.STRING}
    for name in ("FLOAT8E8M0", "FLOAT6E2M3", "FLOAT6E3M2"):
        if hasattr(onnx.TensorProto, name):
            bad.add(getattr(onnx.TensorProto, name))

    def types_in_graph(g: onnx.GraphProto) -> Iterable[int]:
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.WhichOneof("value") == "tensor_type":
                yield vi.type.tensor_type.elem_type
            else:
                yield onnx.TensorProto.STRING  # sequences, maps, optionals: out of the core scope
        for t in g.initializer:
            yield t.data_type
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    yield a.t.data_type
                if a.name == "to" and a.type == onnx.AttributeProto.INT:
                    yield a.i
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from types_in_graph(a.g)

    return any(t in bad for t in types_in_graph(model.graph))


def model_ops(model: object) -> list[str]:
    import onnx

    assert isinstance(model, onnx.ModelProto)
    ops: list[str] = []

    def walk(g: onnx.GraphProto) -> None:
        for n in g.node:
            ops.append(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)

    walk(model.graph)
    return ops


def in_core_scope(name: str, model: object) -> bool:
    """Whether a case counts toward the core op list's conformance figure."""
    if name.startswith("test_training_dropout"):
        return False
    return all(o in CORE_OPS for o in model_ops(model)) and not _excluded_types(model)


def load_case(case_dir: str) -> tuple[object, list[np.ndarray], list[np.ndarray]]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    data = os.path.join(case_dir, "test_data_set_0")
    n_in = len(glob.glob(os.path.join(data, "input_*.pb")))
    n_out = len(glob.glob(os.path.join(data, "output_*.pb")))
    inputs = [numpy_helper.to_array(onnx.load_tensor(os.path.join(data, f"input_{i}.pb"))) for i in range(n_in)]
    outputs = [numpy_helper.to_array(onnx.load_tensor(os.path.join(data, f"output_{i}.pb"))) for i in range(n_out)]
    return model, inputs, outputs


def compare(actual: list[np.ndarray], expected: list[np.ndarray]) -> str | None:
    """None when outputs match under the ONNX runner's rules, else what differs."""
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = np.asarray(a)
        if a.dtype != e.dtype:
            return f"output {i}: dtype {a.dtype}, expected {e.dtype}"
        if a.shape != e.shape:
            return f"output {i}: shape {a.shape}, expected {e.shape}"
        rtol = RTOL
        if e.dtype.name == "bfloat16":
            a, e = a.astype(np.float32), e.astype(np.float32)
            rtol = max(rtol, 2**-6)
        if e.dtype == np.bool_ or e.dtype.kind in "iu":
            if not np.array_equal(a, e):
                bad = int(np.sum(a != e))
                return f"output {i}: {bad} of {e.size} elements differ"
            continue
        try:
            np.testing.assert_allclose(a, e, rtol=rtol, atol=ATOL, equal_nan=True)
        except AssertionError as exc:
            lines = [ln for ln in str(exc).splitlines() if ln.strip()][:4]
            return f"output {i}: " + " | ".join(ln.strip() for ln in lines)
    return None


Runner = Callable[[object, list[np.ndarray]], list[np.ndarray]]


def cuvil_runner(target: str, *, sanitize: bool = False, cache_dir: str | None = None) -> Runner:
    from cuvil.api import compile as cuvil_compile

    def run(model: object, inputs: list[np.ndarray]) -> list[np.ndarray]:
        m = cuvil_compile(model, target=target, sanitize=sanitize, cache_dir=cache_dir)
        return list(m(*inputs))

    return run


def run_cases(case_dirs: Iterable[str], target: str, runner: Runner | None = None,
              progress: Callable[[CaseResult], None] | None = None) -> Summary:
    run = runner or cuvil_runner(target)
    summary = Summary(target)
    for case in case_dirs:
        name = os.path.basename(case.rstrip("/"))
        t0 = time.perf_counter()
        try:
            model, inputs, expected = load_case(case)
        except Exception as exc:  # a case we cannot read is reported, not fatal
            r = CaseResult(name, "error", [], False, f"cannot load case: {exc}")
            summary.results.append(r)
            if progress:
                progress(r)
            continue
        ops = model_ops(model)
        scope = in_core_scope(name, model)
        try:
            actual = run(model, inputs)
            diff = compare(actual, expected)
            status, msg = ("pass", "") if diff is None else ("fail", diff)
        except UnsupportedOpError as exc:
            status, msg = "unsupported", str(exc)
        except CuvilError as exc:
            status, msg = "error", f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            status, msg = "error", f"{type(exc).__name__}: {exc}"
        r = CaseResult(name, status, ops, scope, msg[:2000], time.perf_counter() - t0)
        summary.results.append(r)
        if progress:
            progress(r)
    return summary


def case_dirs(root: str | Path, pattern: str | None = None) -> list[str]:
    import re

    root = Path(root)
    if (root / "node").is_dir():
        root = root / "node"
    dirs = sorted(str(p) for p in root.iterdir() if (p / "model.onnx").is_file())
    if pattern:
        rx = re.compile(pattern)
        dirs = [d for d in dirs if rx.search(os.path.basename(d))]
    return dirs
