"""The PyTorch front end against the ONNX one: a model compiled from ``torch.export`` gets the
kernels its ONNX export gets.

``torch.export`` decomposes a model differently from the ONNX exporter (``nn.Linear`` into a
transposed weight and ``addmm``, products over sequences into reshape -> bmm -> reshape, SDPA into
its math).  Every node the optimised graph from PyTorch has beyond the optimised graph of the
same model exported to ONNX is work the ONNX path shows can be avoided: a transpose per call, a
product whose epilogue did not fuse, attention written out.
"""

from __future__ import annotations

from collections import Counter

import pytest

from cuvil.frontends.onnx import load_onnx
from cuvil.frontends.torch import load_torch
from cuvil.passes import PassManager, default_pipeline
from tests.support.exported import ModelStore
from tests.support.zoo.networks import CASES

# every test exports a zoo model through both front ends and compiles it (tens of seconds each)
pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning")]


def _ops(graph: object) -> Counter[str]:
    ops = Counter(n.op for n in PassManager(default_pipeline("native")).run(graph).nodes)  # type: ignore[arg-type]
    del ops["constant"]
    return ops


@pytest.mark.parametrize("name", list(CASES))
def test_torch_export_gets_the_kernels_of_the_onnx_export(models: ModelStore, name: str) -> None:
    case = CASES[name]
    from_torch = _ops(load_torch(case.build(), input_spec=list(case.inputs(2))).graph)
    from_onnx = _ops(load_onnx(str(models.get(name).path)))
    extra = from_torch - from_onnx
    assert not extra, f"{name}: from torch.export, beyond the ONNX export's graph: {dict(extra)}"
    if "attention" in from_onnx:
        assert from_torch["attention"] == from_onnx["attention"]
