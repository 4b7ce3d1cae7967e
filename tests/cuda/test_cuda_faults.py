"""The CUDA kernels' planted faults (cuvil/faults.py: CUDA_FAULTS) make the emulated tests fail: a
missing barrier in the tiled matmul, an off-by-one bound on its inner dim, a warp shuffle reading
the wrong lane.  Each is a real bug of GPU code that the execution harness exposes (its threads
are fibers run in turn, so a read without a barrier sees stale shared memory); the same graph
built without the fault matches the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.faults import CUDA_FAULTS
from cuvil.ir.parser import parse_graph
from cuvil.metrics import relative_l2
from tests.cuda.support import harness_missing

pytestmark = pytest.mark.skipif(harness_missing() is not None, reason=str(harness_missing()))

# K = 40: more than one 16-wide tile (the barrier matters) and not a multiple of 16 (the bound does)
MATMUL = """graph main(%a: f32[n, 40], %b: f32[40, 24]) {
  symbol n in 1..64
  %y = matmul(%a, %b) : f32[n, 24]
  return %y
}
"""
SOFTMAX = """graph main(%x: f32[n, 300]) {
  symbol n in 1..64
  %y = softmax(%x) {axis = -1} : f32[n, 300]
  return %y
}
"""
GRAPH_OF = {"cuda-matmul-no-sync": MATMUL, "cuda-matmul-tile-bound": MATMUL, "cuda-shuffle-lane": SOFTMAX}


def error_with(text: str, faults: frozenset[str], tmp: Path) -> float:
    g = parse_graph(text)
    m = cuvil.compile(g, target="cuda-sim", cache_dir=str(tmp), faults=faults)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal([d if isinstance(d, int) else 20 for d in s.type.shape]).astype(np.float32)
          for s in m.input_specs]
    return relative_l2(np.asarray(m(*xs)), np.asarray(cuvil.compile(g, target="ref")(*xs)))


def test_every_cuda_fault_has_a_case() -> None:
    assert set(GRAPH_OF) == set(CUDA_FAULTS)


@pytest.mark.slow  # two builds each (with and without the fault)
@pytest.mark.parametrize("fault", sorted(GRAPH_OF))
def test_planted_fault_is_caught_and_the_clean_build_passes(fault: str, tmp_path: Path) -> None:
    assert error_with(GRAPH_OF[fault], frozenset(), tmp_path) <= 1e-5
    assert error_with(GRAPH_OF[fault], frozenset({fault}), tmp_path) > 1e-3
