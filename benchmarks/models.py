"""The networks of the benchmark zoo, built in plain PyTorch (no torchvision, no downloads).

Five models, each at its usual inference size:

1. ``mlp``: 784-1024-1024-10 with ReLU (an MNIST-sized classifier);
2. ``resnet18``: ResNet-18 on 224x224 images (He et al. 2015);
3. ``mobilenet_v2``: MobileNetV2, width 1.0, on 224x224 images (Sandler et al. 2018);
4. ``bert_tiny``: a BERT-tiny-like encoder: hidden 128, 2 layers, 2 heads, FFN 512, sequence 128,
   token + position embeddings, an attention mask input, post-norm layers with GELU;
5. ``cifar_cnn``: a CIFAR-sized VGG-style CNN on 32x32 images.

Builders return models in eval mode with seeded weights.  Batch-norm statistics and
LayerNorm affine parameters are randomised: at their fresh values (mean 0, var 1,
weight 1, bias 0) those layers are identities at inference, and a compiler that
folds or fuses them wrongly would still give the right answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


def _seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``build()`` under a fixed seed, in eval mode, with non-trivial normalisation parameters."""
    torch.manual_seed(seed)
    model = build()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    return model.eval()


# MLP ---------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (784, 1024, 1024, 10)) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, lin in enumerate(self.linears):
            x = lin(x)
            if i < len(self.linears) - 1:
                x = F.relu(x)
        return x


# ResNet-18 ---------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (projected when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.down(x))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks: list[nn.Module] = []
        cin = 64
        for i in range(4):
            cout = 64 * 2**i
            for j in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        out: torch.Tensor = self.fc(torch.flatten(y, 1))
        return out


# MobileNetV2 -------------------------------------------------------------------------------------


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()
    )


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> linear projection (1x1), residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(cin, hidden, 1, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    # (expansion t, channels c, repeats n, first stride s): the paper's table, width 1.0
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        cin = 32
        layers: list[nn.Module] = [_conv_bn_relu6(3, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn_relu6(cin, 1280, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1280, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.classifier(self.features(x).mean(dim=(2, 3)))
        return out


# BERT-tiny-like encoder ----------------------------------------------------------------------------


class BertSelfAttention(nn.Module):
    """Multi-head attention written out: QKᵀ -> scale -> additive mask -> softmax -> V."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h, dh = self.heads, d // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, s, h, dh).transpose(1, 2)  # (b, h, s, dh)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh)) + mask
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(b, s, d))
        return out


class BertLayer(nn.Module):
    """BERT's post-norm layer: LN(x + attn(x)), then LN(x + W2 gelu(W1 x))."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.attn = BertSelfAttention(hidden, heads)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = nn.Linear(hidden, ffn)
        self.ff2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x, mask))
        out: torch.Tensor = self.ln2(x + self.ff2(F.gelu(self.ff1(x))))
        return out


class BertTiny(nn.Module):
    def __init__(self, vocab: int = 30522, seq: int = 128, hidden: int = 128, heads: int = 2, ffn: int = 512,
                 layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.randn(1, seq, hidden) * 0.02)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # BERT's extended mask: 0 where attended, -10000 where masked, broadcast over heads and queries
        mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        x: torch.Tensor = self.ln(self.embed(input_ids) + self.pos)
        for layer in self.layers:
            x = layer(x, mask)
        return x


# CIFAR CNN ---------------------------------------------------------------------------------------


def _vgg_block(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class CifarCNN(nn.Module):
    """Three stages of two 3x3 conv-BN-ReLU and a 2x2 max-pool (32, 64, 128 channels), then 2048-256-10."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 3
        for cout in (32, 64, 128):
            layers += _vgg_block(cin, cout) + _vgg_block(cout, cout) + [nn.MaxPool2d(2)]
            cin = cout
        self.features = nn.Sequential(*layers)
        self.fc1 = nn.Linear(128 * 4 * 4, 256)
        self.fc2 = nn.Linear(256, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc2(F.relu(self.fc1(torch.flatten(self.features(x), 1))))
        return out


# The zoo -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooModel:
    """One benchmark network: how to build it and its seeded inputs for a batch size."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]  # batch size -> inputs, in forward()'s order


def _gen(batch: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + batch)


def _images(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, 3, size, size, generator=_gen(batch)),)


def _bert_inputs(batch: int) -> tuple[torch.Tensor, ...]:
    gen = _gen(batch)
    ids = torch.randint(0, 30522, (batch, 128), generator=gen)
    # every sequence is padded after a random length (at least half): the mask is not all ones
    lengths = torch.randint(64, 129, (batch, 1), generator=gen)
    mask = (torch.arange(128)[None, :] < lengths).to(torch.int64)
    return ids, mask


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("mlp", lambda: _seeded(MLP, 1), lambda b: (torch.randn(b, 784, generator=_gen(b)),)),
        ZooModel("resnet18", lambda: _seeded(ResNet18, 18), _images(224)),
        ZooModel("mobilenet_v2", lambda: _seeded(MobileNetV2, 2), _images(224)),
        ZooModel("bert_tiny", lambda: _seeded(BertTiny, 4), _bert_inputs),
        ZooModel("cifar_cnn", lambda: _seeded(CifarCNN, 10), _images(32)),
    )
}
