"""The benchmark's deployment-sized models: the corpus's architectures at the sizes teams ship.

The test corpus (``tests/support/corpus``) builds every architecture at hidden size ~32 so that the
suite stays fast; at that size a model's latency is mostly per-call and per-node overhead.  Speed on
a user's model depends on the kernels at real sizes, so the benchmark corpus also builds, from
configs written out here (no download), the same architectures and a few non-transformer models at
the sizes of small deployed models:

- text: BERT-mini (4 layers, hidden 256), two BERT-base layers (hidden 768), DistilBERT and GPT-2
  at hidden 768 (two layers), a Llama block stack (hidden 512, grouped-query attention, SwiGLU,
  RMSNorm, rotary embeddings), a T5 encoder (relative attention buckets); sequence 128;
- vision: ViT-S/16 and DeiT-S at 224x224 (4 layers), ConvNeXt at 224x224 with its real stage
  widths (48-384), MobileViT-XXS at 256x256, Swin-T-sized stages at 224x224;
- speech: Whisper-tiny's encoder (80 mels, 1,000 frames), wav2vec2 with its full 512-channel 1-D
  convolutional feature extractor over one second of 16 kHz audio;
- small-channel CNNs: a CIFAR ResNet-20 (16-64 channels) at 32x32 and a 64x64 variant; a CRNN text
  recogniser (a VGG-style conv stack over a 32x128 line image, then a bidirectional LSTM over the
  width); a single-shot detector with a 16-64-channel backbone and per-scale box/class heads at
  320x320.

Each is a :class:`tests.support.corpus.models.CorpusModel` with seeded weights (the tensors
``transformers`` initializes to constants redrawn), so an export is cached on disk and reproducible.
"""

from __future__ import annotations

import torch
import transformers
from torch import nn

from tests.support.corpus.models import (
    IMAGE_DYNAMIC,
    TEXT,
    TEXT_DYNAMIC,
    CorpusModel,
    Shape,
    _audio,
    _features,
    _images,
    _text,
)

SEQ = 128
VOCAB = 8192  # a word-piece vocabulary cut down so the LM heads do not dominate the decoders
TEXT_SHAPE = Shape(1, SEQ)


def _bert(hidden: int, layers: int, heads: int) -> nn.Module:
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, max_position_embeddings=512, type_vocab_size=2))


def _distilbert() -> nn.Module:
    return transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=768, n_layers=2, n_heads=12, hidden_dim=3072, max_position_embeddings=512))


def _gpt2() -> nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=768, n_layer=2, n_head=12, n_positions=512, use_cache=False))


def _llama() -> nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=4, max_position_embeddings=512, use_cache=False))


def _t5_encoder() -> nn.Module:
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048, num_layers=2, num_heads=8, use_cache=False))


def _vit() -> nn.Module:
    return transformers.ViTModel(transformers.ViTConfig(
        image_size=224, patch_size=16, num_channels=3, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
        intermediate_size=1536))


def _deit() -> nn.Module:
    return transformers.DeiTModel(transformers.DeiTConfig(
        image_size=224, patch_size=16, num_channels=3, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
        intermediate_size=1536))


def _swin() -> nn.Module:
    return transformers.SwinModel(transformers.SwinConfig(
        image_size=224, patch_size=4, num_channels=3, embed_dim=48, depths=[1, 1, 2, 1], num_heads=[2, 4, 8, 16],
        window_size=7))


def _convnext() -> nn.Module:
    return transformers.ConvNextModel(transformers.ConvNextConfig(
        num_channels=3, patch_size=4, hidden_sizes=[48, 96, 192, 384], depths=[1, 1, 3, 1], num_stages=4,
        image_size=224))


def _mobilevit() -> nn.Module:
    return transformers.MobileViTModel(transformers.MobileViTConfig(
        num_channels=3, image_size=256, patch_size=2, hidden_sizes=[64, 80, 96],
        neck_hidden_sizes=[16, 16, 24, 24, 48, 48, 64, 64, 80, 80, 320], num_attention_heads=4, expand_ratio=2.0,
        initializer_range=0.2))


WHISPER_FRAMES = 1000


def _whisper_encoder() -> nn.Module:
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    return WhisperEncoder(transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=80, d_model=384, encoder_layers=2, encoder_attention_heads=6,
        encoder_ffn_dim=1536, max_source_positions=WHISPER_FRAMES // 2, use_cache=False))


def _wav2vec2() -> nn.Module:
    return transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(
        hidden_size=384, num_hidden_layers=2, num_attention_heads=6, intermediate_size=1536, vocab_size=32))


# -- small-channel CNNs, written out ----------------------------------------------------------------


def _conv_bn_relu(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class _Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn_relu(cin, cout, stride), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


class CifarResNet(nn.Module):
    """ResNet-20 (He et al. 2015, the CIFAR variant): three stages of three basic blocks, 16-32-64 channels."""

    def __init__(self, blocks: int = 3, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn_relu(3, 16)]
        cin = 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for b in range(blocks):
                layers.append(_Basic(cin, cout, stride if b == 0 else 1))
                cin = cout
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(64, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(pixel_values).mean((2, 3)))


class CRNN(nn.Module):
    """A text-line recogniser: a VGG-style conv stack that pools the height away, then a bidirectional
    LSTM over the width and a per-column classifier (CTC logits)."""

    def __init__(self, classes: int = 37) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            *_conv_bn_relu(1, 32), nn.MaxPool2d(2),            # 16 x 64
            *_conv_bn_relu(32, 64), nn.MaxPool2d(2),           # 8 x 32
            *_conv_bn_relu(64, 128), *_conv_bn_relu(128, 128), nn.MaxPool2d((2, 1)),  # 4 x 32
            *_conv_bn_relu(128, 256), nn.MaxPool2d((4, 1)))    # 1 x 32
        self.rnn = nn.LSTM(256, 128, batch_first=True, bidirectional=True)
        self.head = nn.Linear(256, classes)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        f = self.cnn(pixel_values).squeeze(2).transpose(1, 2)  # (batch, width, channels)
        return self.head(self.rnn(f)[0])


class Detector(nn.Module):
    """A single-shot detector: a 16-64-channel strided backbone, box and class heads on three scales."""

    def __init__(self, anchors: int = 3, classes: int = 20) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn_relu(3, 16, 2), *_conv_bn_relu(16, 32, 2))   # /4
        self.s1 = nn.Sequential(_Basic(32, 32, 2), _Basic(32, 32, 1))                   # /8
        self.s2 = nn.Sequential(_Basic(32, 48, 2), _Basic(48, 48, 1))                   # /16
        self.s3 = nn.Sequential(_Basic(48, 64, 2), _Basic(64, 64, 1))                   # /32
        self.heads = nn.ModuleList(nn.Conv2d(c, anchors * (5 + classes), 1) for c in (32, 48, 64))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        a = self.s1(self.stem(pixel_values))
        b = self.s2(a)
        c = self.s3(b)
        return torch.cat([h(x).flatten(2) for h, x in zip(self.heads, (a, b, c))], dim=2)


class _Named(nn.Module):
    """A plain module with the corpus's calling convention (positional tensors in, a tuple out)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (self.module(*args),)


class _Plain(CorpusModel):
    """A corpus model that is not a ``transformers`` model."""

    def build(self) -> nn.Module:  # type: ignore[override]
        from tests.support.corpus.models import SEED, _like_trained

        torch.manual_seed(SEED)
        module = self.make()
        _like_trained(module)
        return _Named(module).eval()


def _gray(height: int, width: int):
    def feed(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(shape.batch, 1, height, width, generator=gen),)

    return feed


def _image(name: str, make, outputs: tuple[str, ...], size: int) -> CorpusModel:
    return CorpusModel(name, make, ("pixel_values",), outputs, _images(size), IMAGE_DYNAMIC, Shape(1, 0))


def _text_model(name: str, make, outputs: tuple[str, ...], **kw: bool) -> CorpusModel:
    return CorpusModel(name, make, TEXT, outputs, _text, TEXT_DYNAMIC, TEXT_SHAPE, **kw)


POOLED = ("last_hidden_state", "pooler_output")
MODELS: dict[str, CorpusModel] = {m.name: m for m in [
    _text_model("bert_mini", lambda: _bert(256, 4, 4), POOLED),
    _text_model("bert_base2", lambda: _bert(768, 2, 12), POOLED),
    _text_model("distilbert_base2", _distilbert, ("last_hidden_state",)),
    _text_model("gpt2_base2", _gpt2, ("logits",), vmap_masks=True),
    _text_model("llama_512", _llama, ("logits",), vmap_masks=True),
    _text_model("t5_encoder_512", _t5_encoder, ("last_hidden_state",)),
    _image("vit_s16", _vit, POOLED, 224),
    _image("deit_s16", _deit, POOLED, 224),
    _image("swin_t", _swin, POOLED, 224),
    _image("convnext_t", _convnext, POOLED, 224),
    _image("mobilevit_xxs", _mobilevit, POOLED, 256),
    CorpusModel("whisper_tiny_encoder", _whisper_encoder, ("input_features",), ("last_hidden_state",),
                _features(80), {"input_features": {0: "batch"}}, Shape(1, WHISPER_FRAMES)),
    CorpusModel("wav2vec2_384", _wav2vec2, ("input_values",), ("last_hidden_state", "extract_features"), _audio,
                {"input_values": {0: "batch", 1: "samples"}}, Shape(1, 16000)),
    _Plain("resnet20_cifar", CifarResNet, ("pixel_values",), ("logits",), _images(32), IMAGE_DYNAMIC, Shape(1, 0)),
    _Plain("resnet20_64", CifarResNet, ("pixel_values",), ("logits",), _images(64), IMAGE_DYNAMIC, Shape(1, 0)),
    _Plain("crnn", CRNN, ("pixel_values",), ("logits",), _gray(32, 128), IMAGE_DYNAMIC, Shape(1, 0)),
    _Plain("detector", Detector, ("pixel_values",), ("boxes",), _images(320), IMAGE_DYNAMIC, Shape(1, 0)),
]}
