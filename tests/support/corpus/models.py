"""The corpus's architectures: tiny ``transformers`` models with seeded random weights, and their inputs.

Each :class:`CorpusModel` builds one architecture from a config written out here (no download, no
``AutoConfig``): hidden size about 32, two layers, a few heads, a vocabulary of 99 tokens, 32x32
images, short audio, so that a model builds in well under a second.  The weights are drawn with
``torch.manual_seed(SEED)`` before the model is constructed, so a build gives the same weights in
every process (which is what lets an ONNX export be cached on disk and compared with a model built
again later).

A model is wrapped in :class:`Positional`: positional tensor inputs (the names the exporters give
the ONNX inputs), a tuple of named tensor outputs, and no ``ModelOutput`` objects, caches or
keyword-only arguments left for an exporter to guess about.

The inputs are what a user feeds such a model: token ids drawn within the vocabulary, attention
masks of 0/1 with right padding (row ``i`` of a batch has ``i`` padded positions, at least one token
kept), pixel values and audio drawn from a standard normal.  ``dynamic`` names each input's
symbolic axes for the dynamic variants (batch, and the sequence where the architecture allows it:
the image models and Whisper's encoder check their input size against the config).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from torch import nn

SEED = 0
VOCAB = 99


class Positional(nn.Module):
    """A ``transformers`` model called with positional inputs, returning a tuple of its named outputs."""

    def __init__(self, model: nn.Module, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = tuple(inputs)
        self.output_names = tuple(outputs)

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.input_names, args)), return_dict=True)
        return tuple(out[name] for name in self.output_names)


@dataclass(frozen=True)
class Shape:
    """The sizes a model's inputs are drawn at: batch, and the sequence length (tokens or audio samples)."""

    batch: int
    seq: int


@dataclass(frozen=True)
class CorpusModel:
    """One architecture of the corpus: how to build it and what it is fed."""

    name: str
    make: Callable[[], nn.Module]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    feed: Callable[[Shape, torch.Generator], tuple[torch.Tensor, ...]]
    # per input, its symbolic axes in the dynamic variants: {axis: symbol name}
    dynamic: Mapping[str, Mapping[int, str]]
    # the shape the model is exported at, and the other shapes a dynamic variant is run at
    example: Shape
    others: tuple[Shape, ...] = field(default=())
    # the sizes a symbol may take where the architecture bounds them: {symbol: (min, max)}
    ranges: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    # its attention masks come from transformers' masking_utils, which builds them with torch.vmap
    vmap_masks: bool = False

    def build(self) -> Positional:
        torch.manual_seed(SEED)
        module = self.make()
        _like_trained(module)
        return Positional(module, self.inputs, self.outputs).eval()

    def sample(self, shape: Shape) -> tuple[torch.Tensor, ...]:
        """The inputs at ``shape``, the same on every call (a generator seeded by the shape)."""
        return self.feed(shape, torch.Generator().manual_seed(1000 * shape.batch + shape.seq))


def _like_trained(module: nn.Module) -> None:
    """Draw the tensors that ``transformers`` initializes to constants, as training would have moved them.

    Biases, cls tokens and relative-position tables start at zero, norm scales and running variances at
    one: left so, a front end that dropped a bias, swapped a norm's scale and shift or misindexed a
    position table would still match.  Every floating tensor of the module that is all zeros is drawn
    from N(0, 0.1) and every one that is all ones from U(0.5, 1.5)."""
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            if not t.is_floating_point() or t.numel() == 0:
                continue
            if bool((t == 0).all()):
                t.copy_(0.1 * torch.randn(t.shape, generator=gen))
            elif bool((t == 1).all()):
                t.copy_(0.5 + torch.rand(t.shape, generator=gen))


# inputs ------------------------------------------------------------------------------------------


def _tokens(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (shape.batch, shape.seq), generator=gen)
    mask = torch.ones(shape.batch, shape.seq, dtype=torch.int64)
    for row in range(shape.batch):
        pad = min(row, shape.seq - 1)
        if pad:
            mask[row, shape.seq - pad:] = 0
    return ids, mask


def _text(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return _tokens(shape, gen)


def _images(size: int) -> Callable[[Shape, torch.Generator], tuple[torch.Tensor, ...]]:
    def feed(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(shape.batch, 3, size, size, generator=gen),)

    return feed


def _features(mels: int) -> Callable[[Shape, torch.Generator], tuple[torch.Tensor, ...]]:
    def feed(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(shape.batch, mels, shape.seq, generator=gen),)

    return feed


def _audio(shape: Shape, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(shape.batch, shape.seq, generator=gen),)


# architectures -----------------------------------------------------------------------------------

TEXT = ("input_ids", "attention_mask")
TEXT_DYNAMIC = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
TEXT_EXAMPLE = Shape(2, 8)
TEXT_OTHERS = (Shape(3, 13), Shape(1, 5))
TEXT_RANGES = {"seq": (None, 64)}  # the position embeddings' length
IMAGE_DYNAMIC = {"pixel_values": {0: "batch"}}
IMAGE_OTHERS = (Shape(3, 0), Shape(1, 0))


def _bert() -> nn.Module:
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, type_vocab_size=2))


def _distilbert() -> nn.Module:
    return transformers.DistilBertModel(transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64))


def _gpt2() -> nn.Module:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False))


def _llama() -> nn.Module:
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, use_cache=False))


def _t5_encoder() -> nn.Module:
    return transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, use_cache=False))


def _vit() -> nn.Module:
    return transformers.ViTModel(transformers.ViTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37))


def _deit() -> nn.Module:
    return transformers.DeiTModel(transformers.DeiTConfig(
        image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37))


def _swin() -> nn.Module:
    return transformers.SwinModel(transformers.SwinConfig(
        image_size=32, patch_size=2, num_channels=3, embed_dim=16, depths=[1, 2], num_heads=[2, 4], window_size=4,
        mlp_ratio=2.0))


def _convnext() -> nn.Module:
    return transformers.ConvNextModel(transformers.ConvNextConfig(
        num_channels=3, patch_size=4, hidden_sizes=[16, 32], depths=[1, 2], num_stages=2, image_size=32))


def _mobilevit() -> nn.Module:
    return transformers.MobileViTModel(transformers.MobileViTConfig(
        num_channels=3, image_size=64, patch_size=2, hidden_sizes=[16, 24, 32],
        neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48], num_attention_heads=2, expand_ratio=2.0,
        initializer_range=0.2))  # at the default 0.02 its plain conv stacks shrink the signal to zero


WHISPER_FRAMES = 32  # the encoder checks its input is 2 * max_source_positions frames


def _whisper_encoder() -> nn.Module:
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    return WhisperEncoder(transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=2, encoder_attention_heads=4,
        encoder_ffn_dim=37, max_source_positions=WHISPER_FRAMES // 2, use_cache=False))


def _wav2vec2() -> nn.Module:
    return transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2, vocab_size=VOCAB))


def _image_model(name: str, make: Callable[[], nn.Module], outputs: tuple[str, ...], size: int = 32) -> CorpusModel:
    return CorpusModel(name, make, ("pixel_values",), outputs, _images(size), IMAGE_DYNAMIC,
                       Shape(2, 0), IMAGE_OTHERS)


MODELS: dict[str, CorpusModel] = {m.name: m for m in [
    CorpusModel("bert", _bert, TEXT, ("last_hidden_state", "pooler_output"), _text, TEXT_DYNAMIC,
                TEXT_EXAMPLE, TEXT_OTHERS, TEXT_RANGES),
    CorpusModel("distilbert", _distilbert, TEXT, ("last_hidden_state",), _text, TEXT_DYNAMIC,
                TEXT_EXAMPLE, TEXT_OTHERS, TEXT_RANGES),
    CorpusModel("gpt2", _gpt2, TEXT, ("logits",), _text, TEXT_DYNAMIC, TEXT_EXAMPLE, TEXT_OTHERS, TEXT_RANGES,
                vmap_masks=True),
    CorpusModel("llama", _llama, TEXT, ("logits",), _text, TEXT_DYNAMIC, TEXT_EXAMPLE, TEXT_OTHERS, TEXT_RANGES,
                vmap_masks=True),
    CorpusModel("t5_encoder", _t5_encoder, TEXT, ("last_hidden_state",), _text, TEXT_DYNAMIC,
                TEXT_EXAMPLE, TEXT_OTHERS, TEXT_RANGES),
    _image_model("vit", _vit, ("last_hidden_state", "pooler_output")),
    _image_model("deit", _deit, ("last_hidden_state", "pooler_output")),
    _image_model("swin", _swin, ("last_hidden_state", "pooler_output")),
    _image_model("convnext", _convnext, ("last_hidden_state", "pooler_output")),
    _image_model("mobilevit", _mobilevit, ("last_hidden_state", "pooler_output"), size=64),
    CorpusModel("whisper_encoder", _whisper_encoder, ("input_features",), ("last_hidden_state",), _features(8),
                {"input_features": {0: "batch"}}, Shape(2, WHISPER_FRAMES),
                (Shape(3, WHISPER_FRAMES), Shape(1, WHISPER_FRAMES))),
    CorpusModel("wav2vec2", _wav2vec2, ("input_values",), ("last_hidden_state", "extract_features"), _audio,
                {"input_values": {0: "batch", 1: "samples"}}, Shape(2, 400), (Shape(3, 560), Shape(1, 320)),
                {"samples": (60, None)}),  # the feature extractor's convolutions need 60 samples
]}


def eager(module: nn.Module, inputs: Sequence[torch.Tensor]) -> list[Any]:
    """PyTorch's own outputs (the oracle) as NumPy arrays."""
    with torch.no_grad():
        return [o.numpy() for o in module(*inputs)]
