"""Exporting the zoo to ONNX once per session, and the oracles the tests compare Cuvil with.

Exporter choice: ``torch.onnx.export(..., dynamo=True)``.  In torch 2.13 it is
the supported path (the TorchScript exporter, ``dynamo=False``, still works
but warns that it is deprecated and will be removed); it runs offline
(torch.export + onnxscript, both installed) and, with its default graph
optimisation, emits standard ai.onnx ops (Conv, Gemm, MatMul,
LayerNormalization, Softmax, Clip ...), which is what users will feed Cuvil.
It also writes weights as external data (``model.onnx.data``), so the
loader's external-data path is exercised by every large model.

The opset is pinned to 18: LayerNormalization exists (17+), ReduceMean takes
``axes`` as an input (18+), and GELU is still exported as its Erf formula
(the Gelu op only arrives in opset 20), so the tests do not depend on the
newest ops.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from cuvil.metrics import relative_l2
from tests.support.zoo.networks import CASES, ModelCase

OPSET = 18


def assert_outputs_close(
    actual: list[np.ndarray], expected: list[np.ndarray], names: list[str], tol: float, oracle: str
) -> None:
    """Same number of outputs, same dtypes and shapes, relative L2 error at most ``tol`` for each."""
    assert len(actual) == len(expected), f"{len(actual)} outputs, {oracle} gives {len(expected)}"
    for name, a, b in zip(names, actual, expected):
        assert a.dtype == b.dtype, f"output {name!r}: dtype {a.dtype}, {oracle} gives {b.dtype}"
        assert a.shape == b.shape, f"output {name!r}: shape {a.shape}, {oracle} gives {b.shape}"
        assert np.all(np.isfinite(b)), f"output {name!r}: {oracle} output is not finite (bad test input)"
        err = relative_l2(a, b)
        assert err <= tol, f"output {name!r}: relative L2 error {err:.3g} against {oracle} (tolerance {tol:g})"


@dataclass
class ExportedModel:
    """One zoo model, its ONNX file and lazily built oracles."""

    case: ModelCase
    module: torch.nn.Module
    path: Path
    dynamic: bool
    _session: ort.InferenceSession | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.case.name

    def inputs(self, batch: int) -> list[np.ndarray]:
        return [t.numpy() for t in self.case.inputs(batch)]

    def input_names(self) -> list[str]:
        return [i.name for i in self.session.get_inputs()]

    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    @property
    def session(self) -> ort.InferenceSession:
        if self._session is None:
            opts = ort.SessionOptions()
            # The oracle computes the graph as written: no fusions that reorder float arithmetic.
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            self._session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        return self._session

    def onnxruntime(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        feeds = dict(zip(self.input_names(), arrays))
        return [np.asarray(o) for o in self.session.run(None, feeds)]

    def eager(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = self.module(*[torch.from_numpy(a) for a in arrays])
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.numpy() for o in outs]


class ModelStore:
    """Exports each (model, variant) once into a session folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[str, bool, bool], ExportedModel] = {}

    def get(self, name: str, *, dynamic: bool = False, optimize: bool = True) -> ExportedModel:
        key = (name, dynamic, optimize)
        if key not in self._cache:
            self._cache[key] = self._export(CASES[name], dynamic, optimize)
        return self._cache[key]

    def _export(self, case: ModelCase, dynamic: bool, optimize: bool) -> ExportedModel:
        module = case.build()
        tag = ("_dyn" if dynamic else "") + ("" if optimize else "_noopt")
        path = self.root / f"{case.name}{tag}" / "model.onnx"
        path.parent.mkdir(parents=True)
        kwargs: dict[str, Any] = {}
        if dynamic:
            # torch.export specialises sizes 0 and 1, so a symbolic batch is traced at batch 2.
            example = case.inputs(2)
            kwargs["dynamic_shapes"] = tuple({0: torch.export.Dim("batch")} for _ in example)
        else:
            example = case.inputs(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's own deprecation chatter
            torch.onnx.export(
                module, example, str(path), dynamo=True, opset_version=OPSET, optimize=optimize, **kwargs
            )
        proto = onnx.load(str(path), load_external_data=False)
        versions = {o.domain: o.version for o in proto.opset_import}
        assert versions.get("", versions.get("ai.onnx")) == OPSET, f"exporter wrote opsets {versions}"
        return ExportedModel(case, module, path, dynamic)
