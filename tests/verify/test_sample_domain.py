"""Sample inputs of a PyTorch model given with example tensors stay in the examples' integer domain:
token ids inside the vocabulary, a 0/1 mask 0/1 (random -10..10 would index an embedding with
negative ids, which PyTorch refuses, and scale an additive mask far outside anything it sees)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cuvil.verify import verify
from cuvil.verify.context import ModelSource, VerifyContext


class Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.embed(ids) * mask[..., None].to(torch.float32)
        return out


def example() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 50, (2, 6), generator=g), torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])]


def test_integer_samples_take_the_examples_range(tmp_path: Path) -> None:
    ctx = VerifyContext(ModelSource("torch", Embedder().eval(), example()), ["ref"], work_dir=tmp_path)
    ids, mask = ctx.inputs(seed=3)
    assert ids.min() >= 0 and ids.max() <= int(example()[0].max())
    assert set(np.unique(mask)) <= {0, 1}


def test_precision_and_layerwise_run_against_eager(tmp_path: Path) -> None:
    report = verify(Embedder().eval(), input_spec=example(), checks="precision,layerwise", targets=["ref"],
                    cache_dir=tmp_path / "cache", work_dir=tmp_path)
    assert report.exit_status == 0, [(r.check, r.status, r.summary) for r in report]
