"""The zoo's small models: the real structure of each family the torch front end must cover.

Each builder returns ``(model, example_args)``: the model seeded and in eval
mode, the example inputs seeded too (a seeding of their own, not ``networks``':
the global seed, then batch-norm statistics drawn uniformly).  Sizes are small so a test exports and
compiles each in seconds, but every model keeps the layers and data flow of
its family (BasicBlocks with downsampling shortcuts, inverted residuals with
depthwise convs and ReLU6, a ViT's conv patch embedding with class token and
position embedding, BERT's additive attention mask from an int mask, GPT's
causal ``scaled_dot_product_attention``, stacked LSTM/GRU, an MLP).  ``scriptable_bert`` (not in
``MODELS``) is a BERT-style encoder written so that ``torch.jit.script`` takes it, for the TorchScript
tests.  ResNet-18 is
``networks.ResNet`` at width 8; the MobileNetV2 here has its own block table but
``networks``' inverted residual block.  ``SelfAttention`` here goes through
``F.scaled_dot_product_attention``, unlike ``networks.SelfAttention`` (matmuls written out).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tests.support.zoo.networks import InvertedResidual, ResNet, conv_bn_relu6

Built = tuple[nn.Module, tuple[Any, ...]]


def _seeded(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed + 1)


def _randomize_norm_stats(model: nn.Module) -> None:
    """Give BatchNorm running stats and affine params non-trivial values, so the test can see them used."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)


# ResNet-18 and MobileNetV2: the networks' classes, narrower --------------------------------------
def resnet18() -> Built:
    """ResNet-18's layout (stem conv 7x7/2 + maxpool, 4 stages of 2 BasicBlocks, avgpool, fc), width 8."""
    g = _seeded(0)
    m = ResNet((2, 2, 2, 2), num_classes=10, width=8)
    _randomize_norm_stats(m)
    return m.eval(), (torch.randn(2, 3, 64, 64, generator=g),)


class SmallMobileNetV2(nn.Module):
    """MobileNetV2's structure (t, c, n, s settings, narrower and shallower than the paper's, so not
    ``networks.MobileNetV2`` at some width), average pool by ``F.adaptive_avg_pool2d``, dropout + linear
    classifier."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        settings = [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2), (6, 24, 1, 1)]
        layers: list[nn.Module] = [conv_bn_relu6(3, 8, 3, 2)]
        cin = 8
        for t, c, n, s in settings:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn_relu6(cin, 64, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1)).flatten(1)
        return self.classifier(x)


def mobilenet_v2() -> Built:
    g = _seeded(1)
    m = SmallMobileNetV2()
    _randomize_norm_stats(m)
    return m.eval(), (torch.randn(2, 3, 32, 32, generator=g),)


# Transformers -------------------------------------------------------------------------------------
class ViT(nn.Module):
    """ViT: conv patch embedding, class token, learned position embedding, pre-norm encoder, head on the cls token."""

    def __init__(self, image: int = 32, patch: int = 8, dim: int = 32, depth: int = 2, heads: int = 4,
                 num_classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        n = (image // patch) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.norm(self.encoder(x))
        return self.head(x[:, 0])


def vit() -> Built:
    g = _seeded(2)
    return ViT().eval(), (torch.randn(2, 3, 32, 32, generator=g),)


class SelfAttention(nn.Module):
    """Multi-head attention through ``F.scaled_dot_product_attention`` (mask, causal, or neither)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class BertLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = SelfAttention(dim, heads)
        self.ln1 = nn.LayerNorm(dim, eps=1e-12)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.ln2 = nn.LayerNorm(dim, eps=1e-12)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.drop(self.attn(x, mask)))
        return self.ln2(x + self.drop(self.ff(x)))


class Bert(nn.Module):
    """BERT-style post-norm encoder: token + position + segment embeddings, additive mask from an int mask, pooler."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, depth: int = 2, max_len: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.seg = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(dim, heads) for _ in range(depth)])
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device).unsqueeze(0)
        x = self.ln(self.tok(ids) + self.pos(pos) + self.seg(torch.zeros_like(ids)))
        # 1 = attend, 0 = padding -> 0 / large negative, broadcast over heads and query positions
        add_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, add_mask)
        return x, torch.tanh(self.pool(x[:, 0]))


class ScriptableBertLayer(nn.Module):
    """A post-norm BERT layer written within TorchScript's language (no closures, generators or
    ``torch.finfo``): fused QKV projection, attention written out with the additive mask, GELU FFN."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim, eps=1e-12)
        self.ff1 = nn.Linear(dim, 4 * dim)
        self.ff2 = nn.Linear(4 * dim, dim)
        self.ln2 = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape[0], x.shape[1], x.shape[2]
        dh = d // self.heads
        qkv = self.qkv(x).view(b, t, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh) + mask
        y = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.proj(y))
        return self.ln2(x + self.ff2(F.gelu(self.ff1(x))))


class ScriptableBert(nn.Module):
    """A BERT-style encoder that ``torch.jit.script`` accepts: token, position and segment embeddings,
    the additive mask from an int mask (-10000 where padded), post-norm layers, and a tanh pooler on
    the first token; it returns the hidden states and the pooled vector."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, depth: int = 2, max_len: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.seg = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList([ScriptableBertLayer(dim, heads) for _ in range(depth)])
        self.pool = nn.Linear(dim, dim)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        x = self.ln(self.tok(ids) + self.pos(pos) + self.seg(torch.zeros_like(ids)))
        add_mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, add_mask)
        return x, torch.tanh(self.pool(x[:, 0]))


def scriptable_bert() -> Built:
    """:class:`ScriptableBert` with randomised LayerNorm parameters, and ids and a padded mask."""
    g = _seeded(9)
    m = ScriptableBert()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.LayerNorm):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    ids = torch.randint(0, 100, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 11:] = 0
    return m.eval(), (ids, mask)


def bert() -> Built:
    g = _seeded(3)
    ids = torch.randint(0, 100, (2, 16), generator=g)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 11:] = 0
    return Bert().eval(), (ids, mask)


class GptBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), causal=True)
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """GPT-style pre-norm decoder: causal sdpa, tanh GELU, tied LM head."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, depth: int = 2, max_len: int = 64) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList([GptBlock(dim, heads) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(0, ids.shape[1], dtype=torch.long)
        x = self.wte(ids) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def gpt() -> Built:
    g = _seeded(4)
    return Gpt().eval(), (torch.randint(0, 100, (2, 16), generator=g),)


class MaskedAttention(nn.Module):
    """sdpa with an explicit boolean band mask (True = attend) built in the graph, causal, and unmasked."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.attn = SelfAttention(dim, heads)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = x.shape[1]
        pos = torch.arange(t)
        bool_mask = (pos[:, None] - pos[None, :]).abs() <= 4
        return self.attn(x, bool_mask), self.attn(x, causal=True), self.attn(x)


def attention_variants() -> Built:
    g = _seeded(5)
    return MaskedAttention().eval(), (torch.randn(2, 16, 32, generator=g),)


# Recurrent and MLP ---------------------------------------------------------------------------------
class LstmModel(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, (h, c) = self.lstm(x)
        return self.head(y[:, -1]), h, c


def lstm() -> Built:
    g = _seeded(6)
    return LstmModel().eval(), (torch.randn(3, 7, 8, generator=g),)


class GruModel(nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.gru = nn.GRU(features, hidden, layers, batch_first=True)
        self.head = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y, h = self.gru(x)
        return self.head(y[:, -1]), h


def gru() -> Built:
    g = _seeded(7)
    return GruModel().eval(), (torch.randn(3, 7, 8, generator=g),)


def mlp() -> Built:
    g = _seeded(8)
    m = nn.Sequential(nn.Flatten(), nn.Linear(48, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 32), nn.SiLU(),
                      nn.Linear(32, 10), nn.LogSoftmax(dim=-1))
    return m.eval(), (torch.randn(4, 3, 16, generator=g),)


MODELS: dict[str, Callable[[], Built]] = {
    "resnet18": resnet18,
    "mobilenet_v2": mobilenet_v2,
    "vit": vit,
    "bert": bert,
    "gpt": gpt,
    "attention": attention_variants,
    "lstm": lstm,
    "gru": gru,
    "mlp": mlp,
}
