"""The full-size networks of the zoo: the end-to-end model tests' and the benchmarks'.

No downloads and no torchvision: every architecture is spelled out here, so the tests run
offline and the exported graph only holds what these modules do.  Builders return models in eval
mode with deterministic weights (seeded initialisation, plus non-trivial batch-norm and LayerNorm
statistics: at their fresh values those layers are identities at inference, and a compiler that
folds or fuses them wrongly would still give the right answer).

Two tables read these definitions: ``CASES`` (the model tests: ResNet-18, MobileNetV2 at width
0.5, a transformer encoder, a stock ``nn.TransformerEncoder``, a small MLP with a softmax head)
and ``BENCHMARKS`` (the benchmark scripts: an MNIST-sized MLP without the softmax, ResNet-18,
MobileNetV2 at width 1.0, a BERT-tiny-like encoder, a CIFAR-sized CNN).  The benchmarks' ResNet-18
and MobileNetV2 are the same classes as the tests' (width 1.0 rounds every channel count of the
paper's table to itself), seeded alike; the two MLPs differ in size and head and keep distinct
builders (``mlp`` and ``mnist_mlp``).  The two tables' example inputs are seeded differently
(``manual_seed(batch)`` for the tests, ``1000 + batch`` for the benchmarks), as they always were.
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
    """ResNet with basic blocks (He et al. 2015); ``layers=(2, 2, 2, 2)`` is ResNet-18, ``width`` the
    first stage's channels (64 in the paper; the torch front end's family tests use a narrower one)."""

    def __init__(self, layers: tuple[int, ...] = (2, 2, 2, 2), num_classes: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks: list[nn.Module] = []
        cin = width
        for i, n in enumerate(layers):
            cout = width * 2**i
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


def conv_bn_relu6(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
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
            layers.append(conv_bn_relu6(cin, hidden, 1, 1))
        layers += [
            conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),  # depthwise
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
        layers: list[nn.Module] = [conv_bn_relu6(3, cin, 3, 2)]
        for t, c, n, s in self.SETTINGS:
            cout = ch(c)
            for i in range(n):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = ch(1280) if width > 1.0 else 1280
        layers.append(conv_bn_relu6(cin, last, 1, 1))
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
    """Linear layers with ReLU between them, and a softmax over the last one's outputs unless
    ``softmax=False`` (the benchmarks' MLP returns the logits)."""

    def __init__(self, sizes: tuple[int, ...] = (32, 64, 64, 10), softmax: bool = True) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.softmax = softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, lin in enumerate(self.linears):
            x = lin(x)
            if i < len(self.linears) - 1:
                x = torch.relu(x)
        return torch.softmax(x, dim=-1) if self.softmax else x


def mlp() -> nn.Module:
    return _seeded(MLP, seed=3)


def mnist_mlp() -> nn.Module:
    """784-1024-1024-10 with ReLU, logits out: the benchmarks' MNIST-sized classifier."""
    return _seeded(lambda: MLP((784, 1024, 1024, 10), softmax=False), seed=1)


# BERT-tiny-like encoder and a CIFAR CNN (the benchmarks') ----------------------------------------------------------------------------


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
    """A BERT-tiny-like encoder: hidden 128, 2 layers, 2 heads, FFN 512, sequence 128, token and
    learned position embeddings, an attention-mask input, post-norm layers with GELU."""

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


def bert_tiny() -> nn.Module:
    return _seeded(BertTiny, seed=4)


def cifar_cnn() -> nn.Module:
    return _seeded(CifarCNN, seed=10)


@dataclass(frozen=True)
class ModelCase:
    """One network of the zoo and its seeded example inputs for a batch size (what it is exported with)."""

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


def _bench_gen(batch: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + batch)


def _bench_images(size: int) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda batch: (torch.randn(batch, 3, size, size, generator=_bench_gen(batch)),)


def _bert_inputs(batch: int) -> tuple[torch.Tensor, ...]:
    gen = _bench_gen(batch)
    ids = torch.randint(0, 30522, (batch, 128), generator=gen)
    # every sequence is padded after a random length (at least half): the mask is not all ones
    lengths = torch.randint(64, 129, (batch, 1), generator=gen)
    mask = (torch.arange(128)[None, :] < lengths).to(torch.int64)
    return ids, mask


BENCHMARKS: dict[str, ModelCase] = {
    m.name: m
    for m in (
        ModelCase("mlp", mnist_mlp, lambda b: (torch.randn(b, 784, generator=_bench_gen(b)),)),
        ModelCase("resnet18", resnet18, _bench_images(224)),
        ModelCase("mobilenet_v2", lambda: mobilenet_v2(width=1.0), _bench_images(224)),
        ModelCase("bert_tiny", bert_tiny, _bert_inputs),
        ModelCase("cifar_cnn", cifar_cnn, _bench_images(32)),
    )
}
