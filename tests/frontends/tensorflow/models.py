"""Small Keras models built in code (no downloads), seeded, for the TensorFlow front end's tests.

Each builder returns the model and one seeded input batch; batch-norm layers get seeded statistics
and scales (not the identity a fresh layer holds), so folding them is tested."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np

L = keras.layers


def _seed_batchnorms(model: Any, rng: np.random.Generator) -> None:
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, L.BatchNormalization):
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape), rng.normal(0, 0.1, beta.shape),
                               rng.normal(0, 0.1, mean.shape), rng.uniform(0.5, 1.5, var.shape)])


def resnet() -> Any:
    """Two residual blocks with BatchNorm, one strided with a 1x1 shortcut."""
    inp = keras.Input((16, 16, 3), name="image")
    x = L.Conv2D(8, 3, padding="same", use_bias=False, name="stem")(inp)
    x = L.ReLU(name="stem_relu")(L.BatchNormalization(name="stem_bn")(x))
    y = L.Conv2D(8, 3, padding="same", use_bias=False, name="block1_conv1")(x)
    y = L.ReLU(name="block1_relu1")(L.BatchNormalization(name="block1_bn1")(y))
    y = L.Conv2D(8, 3, padding="same", use_bias=False, name="block1_conv2")(y)
    y = L.BatchNormalization(name="block1_bn2")(y)
    x = L.ReLU(name="block1_out")(L.Add(name="block1_add")([x, y]))
    y = L.Conv2D(16, 3, strides=2, padding="same", name="block2_conv")(x)
    s = L.Conv2D(16, 1, strides=2, name="block2_shortcut")(x)
    x = L.ReLU(name="block2_out")(L.Add(name="block2_add")([s, y]))
    x = L.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inp, L.Dense(10, name="logits")(x), name="resnet")


def mobilenet() -> Any:
    """Depthwise-separable blocks with BatchNorm and ReLU6, and an (inactive) Dropout."""
    inp = keras.Input((16, 16, 3), name="image")
    x = L.Conv2D(8, 3, strides=2, padding="same", use_bias=False, name="stem")(inp)
    x = L.ReLU(6.0, name="stem_relu6")(L.BatchNormalization(name="stem_bn")(x))
    x = L.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw1")(x)
    x = L.ReLU(6.0, name="dw1_relu6")(L.BatchNormalization(name="dw1_bn")(x))
    x = L.Conv2D(16, 1, use_bias=False, name="pw1")(x)
    x = L.ReLU(6.0, name="pw1_relu6")(L.BatchNormalization(name="pw1_bn")(x))
    x = L.DepthwiseConv2D(3, strides=2, padding="same", name="dw2")(x)
    x = L.ReLU(6.0, name="dw2_relu6")(x)
    x = L.Dropout(0.2, name="dropout")(L.GlobalAveragePooling2D(name="pool")(x))
    return keras.Model(inp, L.Dense(5, name="logits")(x), name="mobilenet")


def lstm() -> Any:
    """A text classifier: Embedding, LSTM, softmax."""
    inp = keras.Input((12,), dtype="int32", name="tokens")
    x = L.LSTM(24, name="lstm")(L.Embedding(50, 16, name="embed")(inp))
    return keras.Model(inp, L.Dense(3, activation="softmax", name="probs")(x), name="text_classifier")


def transformer() -> Any:
    """One encoder block: self-attention, residuals, LayerNormalization, a feed-forward net."""
    inp = keras.Input((10, 16), name="tokens")
    a = L.MultiHeadAttention(num_heads=2, key_dim=8, name="mha")(inp, inp)
    x = L.LayerNormalization(name="ln1")(L.Add(name="res1")([inp, a]))
    f = L.Dense(16, name="ff2")(L.Dense(32, activation="relu", name="ff1")(x))
    return keras.Model(inp, L.LayerNormalization(name="ln2")(L.Add(name="res2")([x, f])), name="encoder")


def mlp() -> Any:
    """A sequential MLP."""
    return keras.Sequential([keras.Input((20,), name="features"), L.Dense(32, activation="relu", name="hidden1"),
                             L.Dense(16, activation="tanh", name="hidden2"), L.Dense(4, name="scores")], name="mlp")


BUILDERS: dict[str, Callable[[], Any]] = {"resnet": resnet, "mobilenet": mobilenet, "lstm": lstm,
                                          "transformer": transformer, "mlp": mlp}


def build(name: str, batch: int = 2, seed: int = 0) -> tuple[Any, np.ndarray]:
    """The model ``name`` (seeded weights) and a seeded input batch of ``batch`` rows."""
    keras.utils.set_random_seed(seed)
    model = BUILDERS[name]()
    rng = np.random.default_rng(seed)
    _seed_batchnorms(model, rng)
    return model, sample(model, batch, rng)


def sample(model: Any, batch: int, rng: np.random.Generator) -> np.ndarray:
    """A seeded batch for the model's one input (token ids within the embedding's table)."""
    t = model.inputs[0]
    shape = (batch, *t.shape[1:])
    if str(t.dtype).startswith("int"):
        return rng.integers(0, 50, shape).astype(np.int32)
    return rng.standard_normal(shape).astype(np.float32)
