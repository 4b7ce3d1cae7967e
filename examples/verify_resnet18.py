"""ResNet-18 for ``cuvil verify examples/verify_resnet18.py:resnet18``: plain PyTorch, batch symbolic in 1..8.

The network is the benchmark zoo's (tests/support/zoo/networks.py: seeded weights, randomised
batch-norm statistics so that folding them wrongly shows), on 224x224 images.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.zoo.networks import BENCHMARKS as ZOO  # the repository root is on the path above


def resnet18() -> tuple[torch.nn.Module, list[torch.Tensor], dict[str, Any]]:
    """The module, an example input (batch 2) and the batch dim, symbolic in 1..8."""
    zoo = ZOO["resnet18"]
    batch = torch.export.Dim("batch", min=1, max=8)
    return zoo.build(), list(zoo.inputs(2)), {"x": {0: batch}}
