"""A TensorFlow model's inputs as ``tf.TensorSpec``s with named dynamic dims, and the inference-mode
``tf.function`` that tf2onnx converts.

``input_spec`` gives one entry per model input, in order (a dict: by input name): a
``tf.TensorSpec`` (``None`` for a dynamic dim), a ``cuvil.TensorSpec`` (a symbol name or expression
for a dynamic dim: ``("batch", 224, 224, 3)``), or an example array (its shape, static).  Without
``input_spec``, the model's own declaration is used: a functional or sequential Keras model's
``inputs``, a ``tf.function``'s ``input_signature``, a SavedModel's ``serving_default`` signature.

A ``None`` dim becomes a symbol: ``batch`` for the leading dim of every input (the inputs of one
call share their batch), ``<input>_dim<axis>`` for any other.  A ``cuvil.TensorSpec`` names its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, ModelError
from cuvil.ir.spec import TensorSpec
from cuvil.ir.symbolic import format_dim

BATCH = "batch"


@dataclass
class InferenceFunction:
    """What tf2onnx converts: ``function`` (a ``tf.function`` of one tensor per input, returning a
    list of outputs), its input ``specs``, each input's dim names (a symbol's text, or None for a
    static dim), the model's name, and its outputs' names, in order (known once it is traced).

    The outputs are a list, not a dict by name: tf2onnx flattens a dict in the order of its sorted
    keys, so the model's own output order would be lost; :mod:`.convert` names them."""

    function: Any
    specs: list[Any]
    dim_names: list[list[str | None]]
    name: str
    output_names: list[str]


def inference_function(model: Any, input_spec: Any) -> InferenceFunction:
    """The inference-mode function of ``model`` (a Keras layer, a ``tf.function`` or a loaded SavedModel)."""
    import tensorflow as tf

    keras_model = _is_keras(model)
    if keras_model:
        call, declared, names, name = _keras_call(model)
    elif hasattr(model, "signatures") and "serving_default" in model.signatures:
        call, declared, names, name = _saved_model_call(model)
    else:
        call, declared, names, name = _function_call(model)
    specs, dim_names = _specs(input_spec, declared, names)
    if len(specs) != len(names) and declared is not None:
        raise CuvilError(f"input_spec gives {len(specs)} inputs, but the model takes {len(names)}")

    output_names: list[str] = []

    def run(*args: Any) -> list[Any]:
        named = _named_outputs(call(list(args)), model if keras_model else None)
        output_names[:] = list(named)
        return list(named.values())

    return InferenceFunction(tf.function(run, input_signature=specs, autograph=False), specs, dim_names, name,
                             output_names)


def _is_keras(model: Any) -> bool:
    import sys

    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, keras.layers.Layer)


def _keras_call(model: Any) -> tuple[Callable[[list[Any]], Any], list[Any] | None, list[str], str]:
    declared = None
    names: list[str] = []
    try:
        inputs = list(model.inputs)  # functional and sequential models; a subclassed one has none
    except (AttributeError, ValueError):
        inputs = []
    if inputs:
        import tensorflow as tf

        names = [_input_name(_keras_name(t), i) for i, t in enumerate(inputs)]
        declared = [tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype), name=n) for t, n in zip(inputs, names)]

    def call(args: list[Any]) -> Any:
        return model(args[0] if len(args) == 1 else args, training=False)

    return call, declared, names, str(getattr(model, "name", "") or type(model).__name__)


def _saved_model_call(model: Any) -> tuple[Callable[[list[Any]], Any], list[Any] | None, list[str], str]:
    fn = model.signatures["serving_default"]
    _, kwargs = fn.structured_input_signature
    names = list(kwargs)
    declared = [kwargs[n] for n in names]

    def call(args: list[Any]) -> Any:
        return fn(**dict(zip(names, args)))

    return call, declared, names, "saved_model"


def _function_call(model: Any) -> tuple[Callable[[list[Any]], Any], list[Any] | None, list[str], str]:
    sig = getattr(model, "input_signature", None)
    declared = list(sig) if sig is not None else None
    names = [_input_name(getattr(s, "name", None) or "", i) for i, s in enumerate(declared or [])]

    def call(args: list[Any]) -> Any:
        return model(*args)

    name = getattr(getattr(model, "python_function", None), "__name__", None) or getattr(model, "name", "function")
    return call, declared, names, str(name) if str(name).isidentifier() else "function"


def _keras_name(t: Any) -> str:
    """The name of the layer that makes a symbolic Keras tensor (an input's ``keras.Input(name=)``)."""
    history = getattr(t, "_keras_history", None)
    op = getattr(history, "operation", None)
    return str(getattr(op, "name", None) or getattr(t, "name", "") or "")


def _input_name(name: str, i: int) -> str:
    name = re.sub(r":\d+$", "", name or "")
    return name if name else f"input_{i}"


def _specs(input_spec: Any, declared: list[Any] | None, names: list[str]) -> tuple[list[Any], list[list[str | None]]]:
    import tensorflow as tf

    if input_spec is None:
        if declared is None:
            raise CuvilError("compiling this TensorFlow model needs input_spec: tf.TensorSpec or cuvil.TensorSpec "
                             "objects, or example arrays, one per input in order (a subclassed Keras model, or a "
                             "tf.function without an input_signature, declares no inputs)")
        given: list[Any] = declared
    elif isinstance(input_spec, Mapping):
        if not names:
            raise CuvilError("input_spec by name needs a model that names its inputs: give a list, in input order")
        missing = [n for n in names if n not in input_spec]
        if missing or len(input_spec) != len(names):
            raise CuvilError(f"input_spec names {sorted(map(str, input_spec))}, but the model's inputs are {names}")
        given = [input_spec[n] for n in names]
    elif isinstance(input_spec, tf.TensorSpec | TensorSpec | np.ndarray | tf.Tensor):
        given = [input_spec]
    else:
        given = list(input_spec)
    specs: list[Any] = []
    dim_names: list[list[str | None]] = []
    for i, s in enumerate(given):
        name = names[i] if i < len(names) else None
        spec, dims = _one(s, i, name)
        specs.append(spec)
        dim_names.append(dims)
    seen: set[str] = set()
    for s in specs:
        if s.name in seen:
            raise CuvilError(f"input_spec: two inputs are named {s.name!r}")
        seen.add(s.name)
    return specs, dim_names


def _one(s: Any, i: int, name: str | None) -> tuple[Any, list[str | None]]:
    """One input's ``tf.TensorSpec`` (named) and its dim names."""
    import tensorflow as tf

    if isinstance(s, TensorSpec):
        own = name or _input_name(s.name, i)
        dims = [None if isinstance(d, int) else format_dim(d) for d in s.type.shape]
        shape = [d if isinstance(d, int) else None for d in s.type.shape]
        return tf.TensorSpec(shape, tf.as_dtype(s.type.dtype.np), name=own), dims
    if isinstance(s, tf.TensorSpec):
        if s.shape.rank is None:
            raise CuvilError(f"input_spec {i}: {s} has no rank (Cuvil needs every input's rank)")
        own = name or _input_name(s.name or "", i)
        shape = s.shape.as_list()
        return tf.TensorSpec(shape, s.dtype, name=own), [
            None if d is not None else (BATCH if axis == 0 else f"{own}_dim{axis}") for axis, d in enumerate(shape)]
    if isinstance(s, np.ndarray | tf.Tensor) or hasattr(s, "__array__"):
        a = np.asarray(s)
        own = name or f"input_{i}"
        return tf.TensorSpec(a.shape, tf.as_dtype(a.dtype), name=own), [None] * a.ndim
    raise CuvilError(f"input_spec {i}: expected a tf.TensorSpec, a cuvil.TensorSpec or an example array, "
                     f"got {type(s).__name__}")


def _named_outputs(out: Any, model: Any) -> dict[str, Any]:
    """The model's outputs by name: a dict's keys, a Keras model's output names, else ``output`` /
    ``output_0``, ``output_1`` ..."""
    import tensorflow as tf

    if isinstance(out, Mapping):
        return {str(k): v for k, v in out.items()}
    flat = tf.nest.flatten(out)
    if not flat:
        raise ModelError("the model returns no tensor")
    try:
        names = [_keras_name(t) for t in model.outputs] if model is not None else []
    except (AttributeError, ValueError):  # a subclassed model declares no outputs
        names = []
    if len(names) != len(flat) or len(set(names)) != len(names):
        names = ["output"] if len(flat) == 1 else [f"output_{k}" for k in range(len(flat))]
    return dict(zip(names, flat))


__all__ = ["BATCH", "InferenceFunction", "inference_function"]

