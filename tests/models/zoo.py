"""The networks of the end-to-end model tests, written in plain PyTorch.

No downloads and no torchvision: every architecture is spelled out here, so
the tests run offline and the exported graph only holds what these modules
do.  Builders return models in eval mode with deterministic weights (seeded
initialisation, plus non-trivial batch-norm statistics so inference-mode
normalisation is really exercised).
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
    """``build()`` under a fixed seed, in eval mode, with randomised batch-norm statistics.

    Fresh batch norms have mean 0 / var 1 / weight 1 / bias 0, which would make
    them identities at inference; random statistics make a wrong epsilon,
    axis or formula show up in the outputs."""
    torch.manual_seed(seed)
    model = build()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
            elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) * 0.5 + 0.75)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    return model.eval()


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


class ResNet(nn.Module):
    """ResNet with basic blocks (He et al. 2015); ``layers=(2, 2, 2, 2)`` is ResNet-18."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks: list[nn.Module] = []
        cin = 64
        for i, n in enumerate(layers):
            cout = 64 * 2**i
            for j in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(y, 1))


def resnet18(num_classes: int = 1000) -> nn.Module:
    return _seeded(lambda: ResNet((2, 2, 2, 2), num_classes), seed=18)


# MobileNetV2 -------------------------------------------------------------------------------------


def _conv_bn_relu6(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()
    )


class InvertedResidual(nn.Module):
    """Expand (1x1) -> depthwise 3x3 -> linear project (1x1), residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn_relu6(cin, hidden, 1, 1))
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """MobileNetV2 (Sandler et al. 2018) with a width multiplier; the block table is the paper's."""

    # (expansion t, channels c, repeats n, first stride s)
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()

        def ch(c: int) -> int:  # round to a multiple of 8, as the reference implementation does
            return max(8, int(c * width + 4) // 8 * 8)

        cin = ch(32)
        layers: list[nn.Module] = [_conv_bn_relu6(3, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            cout = ch(c)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = ch(1280) if width > 1.0 else 1280
        layers.append(_conv_bn_relu6(cin, last, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.features(x).mean(dim=(2, 3))
        return self.classifier(y)


def mobilenet_v2(width: float = 0.5, num_classes: int = 1000) -> nn.Module:
    return _seeded(lambda: MobileNetV2(width, num_classes), seed=2)


# Transformer encoder ---------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """Multi-head softmax attention written out with matmuls (exports to basic ONNX ops)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        qkv = self.qkv(x).reshape(b, s, 3, h, d // h).permute(2, 0, 3, 1, 4)  # (3, b, h, s, dh)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = torch.softmax(scores, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


class EncoderLayer(nn.Module):
    """A pre-norm transformer encoder layer: x + attn(ln(x)), then x + mlp(ln(x)) with GELU."""

    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, ffn)
        self.ff2 = nn.Linear(ffn, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class TransformerEncoder(nn.Module):
    """Token embedding + learned positions, ``layers`` encoder layers, final LayerNorm and a head."""

    def __init__(self, vocab: int, seq: int, d_model: int, heads: int, ffn: int, layers: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(1, seq, d_model) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(d_model, heads, ffn) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x))


def transformer_encoder() -> nn.Module:
    return _seeded(lambda: TransformerEncoder(vocab=100, seq=16, d_model=64, heads=4, ffn=128, layers=2, classes=10), 7)


class TorchEncoder(nn.Module):
    """Two stock ``nn.TransformerEncoderLayer`` layers (post-norm, GELU) over float inputs."""

    def __init__(self, d_model: int = 64, heads: int = 4, ffn: int = 128, layers: int = 2) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def torch_encoder() -> nn.Module:
    return _seeded(TorchEncoder, seed=11)


# MLP ---------------------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (32, 64, 64, 10)) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, lin in enumerate(self.linears):
            x = lin(x)
            if i < len(self.linears) - 1:
                x = torch.relu(x)
        return torch.softmax(x, dim=-1)


def mlp() -> nn.Module:
    return _seeded(MLP, seed=3)


@dataclass(frozen=True)
class ModelCase:
    """One network of the zoo and the example inputs it is exported with."""

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple[torch.Tensor, ...]]  # batch size -> example inputs


def _images(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch)),)


def _tokens(batch: int) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, 100, (batch, 16), generator=torch.Generator().manual_seed(batch)),)


def _vectors(n: int, *tail: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, n, *tail, generator=torch.Generator().manual_seed(batch)),)


CASES: dict[str, ModelCase] = {
    c.name: c
    for c in (
        ModelCase("resnet18", resnet18, _images(224)),
        ModelCase("mobilenet_v2", mobilenet_v2, _images(160)),
        ModelCase("transformer", transformer_encoder, _tokens),
        ModelCase("torch_encoder", torch_encoder, _vectors(16, 64)),
        ModelCase("mlp", mlp, _vectors(32)),
    )
}
